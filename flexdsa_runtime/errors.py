"""What the runtime refuses, each with what was wrong and what to do.

``RuntimeRefusal`` is the base; a caller that serves requests maps ``ShapeRefused`` to its own "bad request"
(the request's shape is the problem), the others to "the deployment is broken" (the bundle or the machine).
"""

from __future__ import annotations

from typing import Any


class RuntimeRefusal(Exception):
    """Base of every error the runtime raises on purpose; ``details`` is plain data for a log or a response."""

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class BundleError(RuntimeRefusal):
    """The bundle is not usable: no manifest, a file missing, a checksum that does not match, a format this
    runtime does not read."""


class ShapeRefused(RuntimeRefusal):
    """This request's shape cannot be served by the bundle: larger than every bucket, a dim whose padding the
    model does not tolerate and no bucket of exactly that size, a wrong rank or a missing input."""


class BackendUnavailable(RuntimeRefusal):
    """The runtime asked for (or needed by the bundle's artifact) is not installed here."""
