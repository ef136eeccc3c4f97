"""The HTTP contract of run-time traffic and re-specialisation (``service/traffic/routes.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.jobs.schemas import JobOut

# What one push may carry: flexdsa_runtime's Traffic keeps at most this many entries between pushes.
MAX_ENTRIES = 4096
MAX_DIMS = 16
MAX_DIM_VALUE = 2**31 - 1
MAX_COUNT = 2**53  # exact in a JSON number


class TrafficEntryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dims: dict[str, int] = Field(
        ..., min_length=1, max_length=MAX_DIMS, description="Each dynamic dim's value in these requests."
    )
    bucket: str | None = Field(
        None,
        max_length=128,
        description="The bucket that served them; null when the runtime refused the shape.",
    )
    count: int = Field(..., ge=1, le=MAX_COUNT)
    elements: int = Field(0, ge=0, le=MAX_COUNT, description="Their input elements, summed.")
    padded_elements: int = Field(0, ge=0, le=MAX_COUNT, description="The same after padding to the bucket.")


class TrafficIn(BaseModel):
    """``flexdsa_runtime.Traffic.snapshot()``: the shapes a deployed bundle served since the last push."""

    model_config = ConfigDict(extra="forbid")

    bundle_version: str | None = Field(None, max_length=64, description="The runtime's bundle version.")
    target: str | None = Field(None, max_length=64)
    since: float | None = None
    until: float | None = None
    dropped: int = Field(0, ge=0, le=MAX_COUNT, description="Requests of shapes past the runtime's bound.")
    entries: list[TrafficEntryIn] = Field(..., min_length=1, max_length=MAX_ENTRIES)


class TrafficPushOut(BaseModel):
    job_id: str
    stored_entries: int
    requests: int = Field(..., description="Requests of this job's traffic so far, every push added up.")
    padding_waste: float = Field(
        ...,
        description="Padding in input elements: sum(padded - real) / sum(real) input elements over the served "
        "requests so far (the runtime's count; a proposal's padding waste is of the cost instead).",
    )
    auto_respecialised_job_id: str | None = Field(
        None, description="The new version this push started, past the job's auto_respecialise_waste."
    )


class TrafficOut(BaseModel):
    job_id: str
    requests: int
    served: int
    refused: int
    dropped: int
    pushes: int
    padding_waste: float = Field(..., description="Padding in input elements: sum(padded - real) / sum(real).")
    dims: list[str]
    buckets: list[dict[str, Any]] = Field(
        ..., description="The bundle's buckets with the requests each served."
    )
    shapes: list[dict[str, Any]] = Field(..., description="Per distinct shape: dims, count, buckets, waste.")
    histogram: dict[str, list[dict[str, int]]] = Field(..., description="Per dim: requests per value.")


class ProposalOut(BaseModel):
    job_id: str
    requests: int
    max_buckets: int
    cost_basis: str = Field(..., description="What the expected costs rest on, and the job figure they are scaled to.")
    anchor: dict[str, Any] | None = Field(
        None, description="The job's latency figure the expected costs are scaled to: bucket, dims, figure (its label), "
        "complete (False: a lower bound, so are the costs), model_cost_s (the cost model's own), scale.",
    )
    padding_waste_of: str = Field(
        "cost", description="What each row's padding_waste measures: of the cost, not of the input elements."
    )
    current: dict[str, Any] = Field(
        ..., description="This bundle's buckets on the traffic: expected_cost_s (and expected_cost_text, as shown), "
        "padding_waste (of the cost).",
    )
    default: dict[str, Any] = Field(..., description="The target's default buckets on the traffic.")
    proposed: dict[str, Any] = Field(..., description="The buckets chosen from the traffic.")
    gain: dict[str, Any]
    coverage: dict[str, Any] = Field(
        ..., description="How far the current and the proposed buckets reach per dim, and the dims the proposal "
        "serves less of ('narrower', empty unless allow_narrower).",
    )
    notes: list[str]


class RespecialiseIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_buckets: int | None = Field(None, ge=1, le=16, description="At most this many buckets (default 3).")
    shape_buckets: dict[str, list[int]] | None = Field(
        None, description="Compile these buckets instead of the proposal's (the same dims as the traffic)."
    )
    allow_narrower: bool = Field(
        False,
        description="Let the new version serve less than the current one (a smaller largest bucket in some dim): "
        "requests past it are then refused. Off: the proposal keeps the current reach, and given buckets that "
        "serve less are refused, naming what would be lost.",
    )


class TrafficPolicyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    auto_respecialise_waste: float | None = Field(
        ...,
        ge=0,
        le=100,
        description="Re-specialise by itself once the padding waste passes this share; null: off.",
    )
    max_buckets: int | None = Field(None, ge=1, le=16)


class TrafficPolicyOut(BaseModel):
    job_id: str
    auto_respecialise_waste: float | None
    max_buckets: int | None


class VersionOut(BaseModel):
    job: JobOut
    buckets: list[dict[str, Any]] | None


class VersionsOut(BaseModel):
    job_id: str
    versions: list[VersionOut] = Field(..., description="Every version of this bundle, oldest first.")
