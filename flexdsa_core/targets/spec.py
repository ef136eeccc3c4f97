"""``TargetSpec``: everything the compiler knows about a target, as data.

Built-in specs live in their vendor's folder, ``targets/<vendor>/<part>.json``; every figure there carries where it came from
(``sources``), so estimates built on it can say how firm they are. A figure nobody sourced is ``None``,
never a guess: the cost model then falls back to calibration (cpu-ort) or reports the estimate as partial.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flexdsa_core.targets.constraints import known_keys
from flexdsa_core.toolchains import discover_toolchains
from flexdsa_core.vendors import adapter_names, unknown_adapter_message

ONNX_DOMAIN = ""
# Where the Subgraph Mapper places a node: on the target's accelerator, or on the CPU beside it.
ACCELERATOR, CPU = "accelerator", "cpu"


def op_key(op_type: str, domain: str = ONNX_DOMAIN) -> str:
    """``'Conv'`` for standard ONNX ops, ``'com.microsoft::FusedConv'`` for others."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


class Converter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str
    command: str | None = None
    notes: str | None = None


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    version: str = "1"
    vendor: str
    adapter: str = Field(
        ...,
        description="The vendor folder under flexdsa_core/targets/ holding the spec (set from where it "
        "lies); a custom spec names one of the registered adapters (a vendor folder, or 'accelerator').",
    )
    description: str = ""
    # Peak throughput in operations per second, per dtype ('float32', 'float16', 'int8'). None = unsourced.
    peak_ops_per_s: dict[str, float | None] = Field(default_factory=dict)
    mem_bandwidth_bytes_per_s: float | None = None
    sram_bytes: int | None = None
    power_w: float | None = None
    # Float32 operations per second of the CPU beside the accelerator, where a source gives it: CPU-fallback
    # nodes are then estimated on it (``vendor_runs/estimate.py``); None (every built-in part today) leaves their
    # time out of the latency, and the figure says so.
    cpu_peak_ops_per_s: float | None = Field(None, gt=0)
    launch_overhead_s: float = Field(2e-6, description="Per-kernel fixed cost the cost model adds.")
    preferred_layout: Literal["NCHW", "NHWC", "any"] = "NCHW"
    dtypes: list[str] = Field(default_factory=lambda: ["float32"])
    static_shapes: bool = False
    default_shape_buckets: dict[str, list[int]] = Field(default_factory=dict)
    # 'Op' for ai.onnx, 'domain::Op' otherwise. ['*'] = whatever the adapter reports as supported.
    supported_ops: list[str] = Field(default_factory=lambda: ["*"])
    op_constraints: dict[str, dict] = Field(default_factory=dict)
    native_fused_ops: list[str] = Field(default_factory=list)
    converter: Converter | None = None
    # Highest/lowest ai.onnx opset the vendor parser takes (Huawei ATC: 11-15); None = no limit known.
    opset_range: tuple[int, int] | None = None
    # Unsupported ops can run on a CPU beside the accelerator (RKNN/QNN/Vitis AI runtimes); TensorRT has none
    # of its own, so its fallback islands run in ONNX Runtime beside the engine.
    cpu_fallback: bool = True
    # Vendor toolchain that compiles and checks the bundle, if one installs: set by discovery, the toolchain whose
    # ``targets`` name this spec (targets/<vendor>/toolchain.py).
    toolchain: str | None = None
    # What the vendor compiler fuses by itself, by our fusion rule name -> why we leave that pattern to it.
    toolchain_fuses: dict[str, str] = Field(default_factory=dict)
    # The vendor's own fusion switches: name -> what it does (set from our plan in the generated config).
    fusion_switches: dict[str, str] = Field(default_factory=dict)
    # Quantisation formats the toolchain takes, e.g. {"int8": "w8a8 asymmetric, per-channel weights"}.
    quantization: dict[str, str] = Field(default_factory=dict)
    calibrated: bool = Field(False, description="Costs are measured on this machine rather than estimated.")
    sources: dict[str, str] = Field(default_factory=dict, description="Figure name -> where it came from.")

    @field_validator("adapter")
    @classmethod
    def _registered_adapter(cls, name: str) -> str:
        # Only a registered name: the adapter is looked up, never imported from what a request wrote.
        if name not in adapter_names():
            raise ValueError(unknown_adapter_message(name))
        return name

    @field_validator("toolchain")
    @classmethod
    def _known_toolchain(cls, name: str | None) -> str | None:
        if name is not None:
            if name not in discover_toolchains():
                known = ", ".join(discover_toolchains()) or "none"
                raise ValueError(f"unknown toolchain {name!r} (known: {known})")
        return name

    @field_validator("op_constraints")
    @classmethod
    def _known_constraints(cls, constraints: dict[str, dict]) -> dict[str, dict]:
        for op, limits in constraints.items():
            unknown = sorted(set(limits) - known_keys())
            if unknown:
                raise ValueError(
                    f"op_constraints[{op!r}] has unknown key(s) {unknown}; known: {sorted(known_keys())}"
                )
        return constraints

    @cached_property
    def content_sha256(self) -> str:
        """sha256 of the whole spec in canonical JSON (every field, keys sorted): what a cache key holds of
        its target, since two specs may share a name and version (a custom spec, an edited built-in) and
        differ in the figures every cached estimate rests on. Kept once computed: the spec is frozen, and
        ``model_copy`` drops it."""
        fields = self.model_dump(mode="json")
        if fields.get("cpu_peak_ops_per_s") is None:  # added later: a spec without it keeps its hash
            fields.pop("cpu_peak_ops_per_s", None)
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def model_copy(self, *, update=None, deep: bool = False) -> TargetSpec:
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("content_sha256", None)  # an update makes another spec: hashed again when asked
        return copy

    def spec_hash(self) -> str:
        """The short form of ``content_sha256`` (reports, the whole-job cache key)."""
        return self.content_sha256[:16]
