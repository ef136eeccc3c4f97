"""Incidents, for operators only (``Authorization: Bearer <FLEXDSA_OPERATOR_TOKEN>``): the traceback of an
internal error, found by the id the user was shown in the failed job's message."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import select

from service.core.errors import NotFound
from service.core.models import Incident
from service.core.schemas import ERROR_RESPONSES
from service.deps import OperatorOnly, SessionDep
from service.incidents.schemas import IncidentOut, IncidentSummary

router = APIRouter(tags=["operations"], responses=ERROR_RESPONSES, dependencies=[OperatorOnly])


@router.get("/incidents", response_model=list[IncidentSummary], summary="Recent incidents (operators)")
def list_incidents(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[IncidentSummary]:
    rows = session.scalars(select(Incident).order_by(Incident.created_at.desc()).limit(limit)).all()
    return [IncidentSummary.model_validate(row, from_attributes=True) for row in rows]


@router.get("/incidents/{incident_id}", response_model=IncidentOut, summary="One incident with its traceback")
def get_incident(
    session: SessionDep, incident_id: Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")]
) -> IncidentOut:
    row = session.get(Incident, incident_id)
    if row is None:
        raise NotFound(f"No incident {incident_id!r}.")
    return IncidentOut.model_validate(row, from_attributes=True)
