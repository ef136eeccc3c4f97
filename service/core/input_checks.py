"""Input checks at the API boundary: hostile strings and numbers are refused where they enter, with a 4xx
naming the field.

Nothing here trusts the database to refuse for us: PostgreSQL rejects a NUL byte inside text (the request
then failed with a 500), SQLite stores it, and either way a control character in an id, a name or a file
name has no legitimate use. So every string that reaches the service is checked before a route runs:

- path parameters, the query string and header values, by ``refuse_control_characters``, a dependency of
  every route solved before the route's own (``/jobs/{job_id}`` with a NUL answers 422 naming ``job_id``;
  HTTP servers refuse most control characters in headers already, but the check holds behind any server);
- the upload's file name (``service.jobs.upload``) and every string and number of the ``spec`` JSON
  (``check_spec_json``), before the spec is parsed into a ``RequestSpec``.

"Control character" means the C0 range and DEL (U+0000-U+001F, U+007F), the C1 range (U+0080-U+009F), and
lone UTF-16 surrogates (U+D800-U+DFFF, which JSON can spell as ``\\ud800`` but no database can store).
Integers are bounded to int64, the widest the ONNX and the database sides hold; floats must be finite.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from fastapi import Request

from service.core.errors import InvalidRequest

CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# In header values a horizontal tab is legal (RFC 9110 field-value); everything else below 0x20 and DEL is not.
_HEADER_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# A spec is a handful of nested objects; anything this deep is an attack on the parser, not a request.
MAX_SPEC_DEPTH = 32


def control_character(text: str) -> str | None:
    """A description of the first control character in ``text`` ("U+0000 at position 3"), or None."""
    found = CONTROL_CHARACTERS.search(text)
    if found is None:
        return None
    return f"U+{ord(found.group()):04X} at position {found.start()}"


def check_text(field: str, value: str, *, code: str = "invalid_request", what: str = "") -> None:
    """Raise ``InvalidRequest`` (422) naming ``field`` when ``value`` holds a control character."""
    where = control_character(value)
    if where is not None:
        raise InvalidRequest(
            f"{what or field} contains a control character ({where}); ids, names and file names never do.",
            code=code,
            details={"field": field, "reason": f"control character {where}"},
        )


# --- the spec JSON ---------------------------------------------------------------------------------------


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _path(loc: tuple) -> str:
    text = "spec"
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _spec_problem(loc: tuple, msg: str, kind: str) -> InvalidRequest:
    return InvalidRequest(
        f"{_path(loc)}: {msg}.",
        code="invalid_spec",
        details=[{"loc": list(loc), "msg": msg, "type": kind}],
    )


def _walk(value: Any, loc: tuple) -> None:
    if len(loc) > MAX_SPEC_DEPTH:
        raise _spec_problem(loc, f"nested deeper than {MAX_SPEC_DEPTH} levels", "too_deep")
    if isinstance(value, str):
        where = control_character(value)
        if where is not None:
            raise _spec_problem(loc, f"contains a control character ({where})", "control_character")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise _spec_problem(loc, "integer out of range (beyond int64)", "int_out_of_range")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _spec_problem(loc, "number out of range (not finite)", "float_out_of_range")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = control_character(key)
            if where is not None:
                raise _spec_problem(
                    (*loc, key), f"the key contains a control character ({where})", "control_character"
                )
            _walk(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _walk(item, (*loc, index))


def check_spec_json(spec_json: str) -> None:
    """Refuse control characters in any string (keys included), integers beyond int64 and non-finite
    numbers anywhere in the spec, with a 422 naming the field (``spec.shape_buckets.seq[0]``).

    Text that is not JSON at all is left to the ``RequestSpec`` parser, which says where it breaks."""
    try:
        data = json.loads(spec_json, parse_constant=_refuse_constant)
    except RecursionError:
        raise _spec_problem((), f"nested deeper than {MAX_SPEC_DEPTH} levels", "too_deep") from None
    except ValueError as err:
        if "digits" in str(err) or "not a number" in str(err):  # int_max_str_digits, NaN/Infinity
            raise _spec_problem((), f"number out of range ({err})", "number_out_of_range") from None
        where = control_character(spec_json)
        if where is not None:  # a raw control character inside a JSON string is not even JSON
            raise _spec_problem((), f"contains a control character ({where})", "control_character") from None
        return
    _walk(data, ())


# --- the request line and headers -----------------------------------------------------------------------


async def refuse_control_characters(request: Request) -> None:
    """An application-wide dependency, solved before every route's own (so before the tenant lookup and
    any query): refuse control characters in path parameters, the query string and header values.

    A path that matches no route is answered 404 by the router before this runs, which touches nothing."""
    for name, value in request.path_params.items():
        if isinstance(value, str):
            _refuse(value, name, f"The path parameter {name!r}", "invalid_path_parameter")
    for name, value in request.query_params.multi_items():
        _refuse(name, "query string", "A query parameter's name", "invalid_query_parameter")
        _refuse(value, name, f"The query parameter {name!r}", "invalid_query_parameter")
    for raw_name, raw_value in request.headers.raw:
        found = _HEADER_CONTROL_BYTES.search(raw_value)
        if found is not None:
            name = raw_name.decode("latin-1").lower()
            where = f"U+{found.group()[0]:04X} at position {found.start()}"
            raise InvalidRequest(
                f"The header {name!r} contains a control character ({where}).",
                code="invalid_header",
                details={"field": name, "reason": f"control character {where}"},
            )


def _refuse(text: str, field: str, what: str, code: str) -> None:
    check_text(field, text, code=code, what=what)
