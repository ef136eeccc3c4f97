"""The HTTP contract of the built-in targets and the fusion rules a request may switch off."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TargetSummary(BaseModel):
    name: str
    vendor: str
    version: str
    description: str
    dtypes: list[str]
    static_shapes: bool
    checks: str = Field(..., description="How a bundle for this target is checked on this service.")
    toolchain: str | None = Field(None, description="The vendor toolchain that compiles its bundles, if one installs.")
    toolchain_ready: bool = False
    url: str


class FusionRuleOut(BaseModel):
    name: str
    summary: str
    produces: list[str]


class TargetDetail(BaseModel):
    name: str
    spec: dict[str, Any]
    fusion_rules: list[FusionRuleOut] = Field(
        ..., description="Rule names a request may switch off with spec.disabled_rules."
    )
    switchable: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Every name spec.disabled_rules accepts on this target, by kind: generic passes, "
        "fusion rules, the target's own rewrites.",
    )
