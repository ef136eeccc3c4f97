"""``Cost``: what some kernels cost, a small frozen value that adds up (``sum(costs)`` works from 0).

It sits below the per-op work (``op_costs``), the cost model that turns work into seconds and joules
(``cost_model``) and the targets' estimates (``vendor_runs.estimate``), which all hand costs to one another. A
figure that is unavailable (``None``: no sourced peak, no power figure) makes every sum it enters unavailable:
``a + b`` is ``None`` when either is.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Cost"]


@dataclass(frozen=True)
class Cost:
    """What some kernels cost. Adds up; ``joules`` (or ``seconds``) is ``None`` when unavailable, and an
    unavailable term makes the sum unavailable. ``measured`` counts the kernels whose seconds were
    measured on this machine rather than estimated."""

    flops: float = 0.0
    bytes: float = 0.0
    seconds: float | None = 0.0
    joules: float | None = 0.0
    kernels: int = 0
    measured: int = 0

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            flops=self.flops + other.flops,
            bytes=self.bytes + other.bytes,
            seconds=_add_optional(self.seconds, other.seconds),
            joules=_add_optional(self.joules, other.joules),
            kernels=self.kernels + other.kernels,
            measured=self.measured + other.measured,
        )

    def __radd__(self, other):  # so that sum(costs) works from 0
        if other == 0:
            return self
        return NotImplemented

    @property
    def basis(self) -> str:
        if self.kernels == 0 or self.measured == 0:
            return "estimate"
        return "measured" if self.measured == self.kernels else "partly measured"

    def as_dict(self) -> dict:
        return {
            "flops": self.flops,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "joules": self.joules,
            "kernels": self.kernels,
            "measured_kernels": self.measured,
            "basis": self.basis,
        }


def _add_optional(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b
