"""How the core reads a symbolic dim's name: the one place that decides what counts as a batch dim."""

from __future__ import annotations


def is_batch_dim(name: str) -> bool:
    """Whether a dim name reads as a batch size (``batch``, ``batch_size``, ``N`` ...)."""
    return "batch" in name.lower() or name in ("N", "n", "B", "b", "bs")
