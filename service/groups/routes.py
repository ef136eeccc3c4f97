"""Job groups: one upload compared across several targets (``POST /optimize`` with ``targets``).

``GET /groups/{id}``   the group's state, its jobs and the comparison (JSON)
``/ui/groups/{id}``    the same as a page: a table and a chart
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import HTMLResponse

from service.auth.sessions import PageTenant
from service.core.models import JobGroup
from service.core.schemas import ERROR_RESPONSES
from service.dashboard.pages import login_redirect, render, root
from service.deps import CurrentTenant, SessionDep, not_yours
from service.groups import service as groups
from service.groups import views as group_views
from service.groups.schemas import GroupOut

router = APIRouter(tags=["jobs"], responses=ERROR_RESPONSES)


def group_of_current_tenant(
    request: Request,
    group_id: Annotated[str, Path(description="Group id (from POST /optimize with targets)")],
    tenant: CurrentTenant,
    session: SessionDep,
) -> JobGroup:
    return groups.group_of_tenant(session, tenant, group_id, not_yours(request, f"job group {group_id!r}"))


GroupOfCurrentTenant = Annotated[JobGroup, Depends(group_of_current_tenant)]


@router.get(
    "/groups/{group_id}",
    response_model=GroupOut,
    summary="One model compared across targets: the group's state and the comparison",
)
def get_group(request: Request, group: GroupOfCurrentTenant, session: SessionDep) -> GroupOut:
    return groups.group_out(session, group, root(request))


@router.get("/ui/groups/{group_id}", response_class=HTMLResponse, include_in_schema=False)
def group_page(request: Request, group_id: str, session: SessionDep, tenant: PageTenant):
    if tenant is None:
        return login_redirect(request)
    group = session.get(JobGroup, group_id)
    if group is None or group.tenant_id != tenant.id:
        message = f"There is no comparison {group_id!r} for tenant {tenant.name}."
        return render(request, "not_found.html", status_code=404, heading="No such comparison", message=message)
    view = groups.group_out(session, group, root(request))
    return render(
        request,
        "group.html",
        tenant=tenant.name,
        group=view,
        table=group_views.table(view.comparison),
        chart=group_views.chart(view.comparison),
        active=view.status in ("queued", "running"),
    )

