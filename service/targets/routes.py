"""The built-in targets, and the fusion rules a request may switch off."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request

from flexdsa_core import list_targets, load_target
from flexdsa_core.preflight import switchable_names
from flexdsa_core.targets import describe_checks
from flexdsa_core.toolchains import get_toolchain
from service.core.schemas import ERROR_RESPONSES
from service.deps import CurrentTenant, SettingsDep
from service.targets.schemas import FusionRuleOut, TargetDetail, TargetSummary

log = logging.getLogger("flexdsa.service")

router = APIRouter(tags=["targets"], responses=ERROR_RESPONSES)


def _fusion_rules() -> list[FusionRuleOut]:
    try:
        from flexdsa_core.fusions import discover_rules

        rules = discover_rules()
    except Exception:  # a broken rule module must not take the target list down with it
        log.exception("cannot list fusion rules")
        return []
    return [FusionRuleOut(name=r.name, summary=r.summary, produces=list(r.produces)) for r in rules]


@router.get("/targets", response_model=list[TargetSummary], summary="Built-in targets")
def get_targets(request: Request, _tenant: CurrentTenant, settings: SettingsDep) -> list[TargetSummary]:
    root = request.scope.get("root_path", "")
    toolchains_dir = settings.toolchains_dir
    return [
        TargetSummary(
            name=t.name,
            vendor=t.vendor,
            version=t.version,
            description=t.description,
            dtypes=list(t.dtypes),
            static_shapes=t.static_shapes,
            checks=describe_checks(t, toolchains_dir),
            toolchain=t.toolchain,
            toolchain_ready=bool(t.toolchain) and get_toolchain(t.toolchain).is_ready(toolchains_dir),
            url=f"{root}/targets/{t.name}",
        )
        for t in list_targets()
    ]


@router.get(
    "/targets/{name}", response_model=TargetDetail, summary="A target's spec and every switchable name"
)
def get_target(name: str, _tenant: CurrentTenant) -> TargetDetail:
    target = load_target(name)  # TargetNotFoundError -> 404 (service/core/errors.py)
    return TargetDetail(
        name=target.name,
        spec=target.model_dump(mode="json"),
        fusion_rules=_fusion_rules(),
        switchable=switchable_names(target),  # the one registry: passes, fusions and target rewrites
    )
