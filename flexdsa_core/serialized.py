"""One serialisation per model: the bytes of a finished model, made once and shared by everything that
reads them (validation, the never-slower timing, the artifacts, ``OptimizeResult.model_bytes``).

Serialising a transformer of a few hundred MB costs about as much as loading it, and the pipeline used to
do it three to five times for the same model. Within ``serialization_scope()`` ``model_bytes(model)`` is
remembered for the models given to it (at most ``KEPT`` at a time, the latest; the bisections compile
several variants). The scope is opened where models are finished: nothing inside it may change a model
after it was serialised. Outside a scope every call serialises afresh.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import OrderedDict
from collections.abc import Iterator

import onnx_ir as ir

KEPT = 4

_scope: contextvars.ContextVar[OrderedDict[int, tuple[ir.Model, bytes]] | None] = contextvars.ContextVar(
    "serialization_scope", default=None
)


@contextlib.contextmanager
def serialization_scope() -> Iterator[None]:
    """Within this block ``model_bytes`` serialises each model once."""
    token = _scope.set(OrderedDict())
    try:
        yield
    finally:
        _scope.reset(token)


def model_bytes(model: ir.Model) -> bytes:
    """``model`` as ONNX protobuf bytes (models that fit protobuf's 2 GB; see ``ingest.needs_external_data``)."""
    kept = _scope.get()
    if kept is None:
        return ir.to_proto(model).SerializeToString()
    entry = kept.get(id(model))
    if entry is not None and entry[0] is model:  # the model is held, so its id cannot have been reused
        kept.move_to_end(id(model))
        return entry[1]
    data = ir.to_proto(model).SerializeToString()
    kept[id(model)] = (model, data)
    while len(kept) > KEPT:
        kept.popitem(last=False)
    return data


def kept_bytes(model: ir.Model) -> bytes | None:
    """The bytes ``model_bytes`` already made for ``model`` in this scope, or None (never serialises)."""
    entry = (_scope.get() or {}).get(id(model))
    return entry[1] if entry is not None and entry[0] is model else None
