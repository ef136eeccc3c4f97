"""Reading a request spec the one way every surface does: the API (``POST /optimize``), ``flexdsa optimize
--spec`` and ``flexdsa submit`` (which checks what it can before uploading), so a mistake gets the same one-line
answer wherever it is made.

* ``field_errors``: pydantic's errors, one entry per wrong field (``loc``, ``msg``, ``type``); an unknown key
  names the accepted key it most resembles (``did_you_mean``), else the keys accepted there.
* ``SpecError``: those entries and one sentence that carries the first few of them, fix included.
* ``check_calibration_use``: samples sent with a precision that does not use them (fp32) are refused, not ignored.
* ``one_line``: a message and its details as the single line a command line prints.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.options import RequestSpec, did_you_mean, known_keys

# A sentence carries this many field errors; the rest are in ``details``.
ERRORS_IN_MESSAGE = 3


class SpecError(InvalidOptionsError):
    """The spec does not validate; ``details`` lists every wrong field."""

    code = "invalid_spec"


class CalibrationUseError(InvalidOptionsError):
    code = "invalid_calibration"


def field_errors(error: ValidationError) -> list[dict[str, Any]]:
    """Each wrong field of a spec: ``{"loc", "msg", "type"}``, an unknown key with ``did_you_mean``."""
    return [_field_error(entry) for entry in error.errors(include_url=False)]


def _field_error(error: dict) -> dict[str, Any]:
    loc = list(error.get("loc", ()))
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    entry: dict[str, Any] = {"loc": loc, "msg": message, "type": error.get("type", "")}
    if entry["type"] == "extra_forbidden":
        suggestion = did_you_mean(loc)
        if suggestion:
            entry["did_you_mean"] = suggestion
            entry["msg"] = f"Unknown key {loc[-1]!r}: did you mean {suggestion!r}?"
        else:
            entry["msg"] = f"Unknown key {loc[-1]!r}. Accepted here: {', '.join(known_keys(loc)) or 'see the API docs'}."
    return entry


def spec_error(error: ValidationError, what: str = "The spec") -> SpecError:
    """One sentence naming the first wrong fields with their fix (``what`` names what was read: "The 'spec'
    field", "The --spec file"), every field in ``details``."""
    details = field_errors(error)
    return SpecError(f"{what} is not a valid request spec: {describe(details)}", details=details)  # type: ignore[arg-type]


def describe(details: list[dict]) -> str:
    """``loc: msg`` of the first field errors, joined; ``(and N more)`` past ``ERRORS_IN_MESSAGE``."""
    parts = [_located(item) for item in details[:ERRORS_IN_MESSAGE] if isinstance(item, dict)]
    more = len(details) - ERRORS_IN_MESSAGE
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _located(item: dict) -> str:
    loc = ".".join(str(part) for part in item.get("loc", ()))
    message = str(item.get("msg", "")).rstrip(".")
    if message.startswith("Unknown key") or not loc:
        return message
    return f"{loc}: {message}"


def parse_request(data: dict | str, what: str = "The spec") -> RequestSpec:
    """The ``RequestSpec`` of a dict or a JSON string, or ``SpecError``. The target is not looked up here."""
    try:
        if isinstance(data, str):
            return RequestSpec.model_validate_json(data)
        return RequestSpec.model_validate(data)
    except ValidationError as err:
        raise spec_error(err, what) from None


def check_calibration_use(spec, has_calibration: bool) -> None:
    """Calibration samples are for a precision that quantises or narrows (int8, mixed, fp16): sent with fp32
    they would be silently unused, so they are refused."""
    if has_calibration and spec.precision == "fp32":
        raise CalibrationUseError(
            "Calibration samples were given but the precision is fp32, which does not use them: set precision "
            "to int8, mixed or fp16 (--precision int8), or leave the samples out."
        )


def one_line(message: str, details: Any = None) -> str:
    """A message as one line: line breaks folded, and a refused spec's field errors appended when the message
    does not already carry them."""
    text = " ".join(str(message).split())
    if isinstance(details, list) and details and all(isinstance(item, dict) for item in details):
        missing = [item for item in details if str(item.get("msg", "")).rstrip(".") not in text]
        if missing:
            text = f"{text.rstrip('.').removesuffix('; see details')}: {describe(missing)}"
    return text


def parse_buckets(values: list[str]) -> dict[str, list[int]]:
    """``shape_buckets`` from the command line: ``seq=32,64`` (one dim per value, repeatable; ``;`` also
    separates dims) or one JSON object. ``SpecError`` saying how to write it."""
    import json

    if len(values) == 1 and values[0].lstrip().startswith("{"):
        try:
            data = json.loads(values[0])
        except ValueError as err:
            raise SpecError(f"--buckets {values[0]!r} is not valid JSON ({err}); write e.g. '{{\"seq\": [32, 64]}}'.") from None
        return data
    buckets: dict[str, list[int]] = {}
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(";"))):
            name, sep, sizes = part.partition("=")
            try:
                numbers = [int(size) for size in sizes.split(",") if size.strip()]
            except ValueError:
                numbers = []
            if not sep or not name.strip() or not numbers:
                raise SpecError(
                    f"--buckets {part!r}: write <dim>=<sizes>, e.g. 'seq=32,64' (repeat --buckets for each dim), "
                    "or a JSON object."
                )
            buckets[name.strip()] = numbers
    return buckets
