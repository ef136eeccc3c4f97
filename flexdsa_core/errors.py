"""The errors the compiler core raises. Every message says what was wrong and what to do about it.

Callers (the CLI, the service) catch ``FlexDSAError`` and show ``str(err)``; anything else escaping the
core is a bug. ``code`` is a stable machine-readable name, ``http_status`` the status a service answers.
"""

from __future__ import annotations


class FlexDSAError(Exception):
    code = "flexdsa_error"
    http_status = 422

    def __init__(self, message: str, *, details: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidModelError(FlexDSAError):
    """The upload is not a usable ONNX model (not protobuf, truncated, fails the checker...)."""

    code = "invalid_model"


class UnsupportedModelError(FlexDSAError):
    """A well-formed model that this compiler cannot take (opset too old, unknown domain, too large...)."""

    code = "unsupported_model"


class ExternalDataError(InvalidModelError):
    """External data missing, or pointing outside the model's own folder."""

    code = "invalid_external_data"


class TargetNotFoundError(FlexDSAError):
    code = "unknown_target"
    http_status = 404


class InvalidOptionsError(FlexDSAError):
    code = "invalid_options"


class ValidationFailedError(FlexDSAError):
    """The optimised model's outputs differ from the original beyond tolerance and could not be restored."""

    code = "validation_failed"


class RunBudgetExceededError(FlexDSAError):
    """One ONNX Runtime run of the pipeline (validation, latency, a shape probe) ran past its time budget:
    a model whose run time the compiler cannot bound (a Loop of 10^9 iterations, an absurd shape)."""

    code = "run_budget_exceeded"


class CancelledError(FlexDSAError):
    """The caller asked, through the progress callback, to stop."""

    code = "cancelled"
    http_status = 409
