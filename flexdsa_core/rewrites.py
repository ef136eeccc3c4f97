"""One kind of object for every rewrite the compiler makes: ``Rewrite``, whatever its kind.

A rewrite is declared once, where its code is, with its ``name`` (what ``disabled_rules``, bisection,
``applied`` and the report call it), its ``kind``, what it must run ``after`` (names; a circle is refused
when the rewrites are ordered), what it ``produces`` (op keys), and how it applies:

* ``kind="pass"`` (``PassRewrite``, declared in ``passes/__init__.py``): ``make(options)`` builds an onnx_ir
  pass (``onnx_ir.passes.PassBase``: ``call(model) -> PassResult``), run to a fixed point by ``run_passes``.
* ``kind="fusion"`` (``fusions.base.FusionRule``, one module per rule under ``fusions/``, found by discovery):
  onnxscript ``RewriteRule``s, each match taken or refused by the Fusion Switcher on cost.
* ``kind="legalisation"`` (``Legalisation``, declared by a target adapter in its ``legalisations``):
  ``apply(result, target)`` rewrites ``result.model`` (``targets.base.Legalized``) for the vendor's tools and
  says whether it changed anything; ``counting(...)`` makes one from a ``model -> count`` function.

``ordered(rewrites)`` is the only order: a topological sort on ``after``, ties kept in declaration order.
``registry.Registry`` gathers the three kinds for one target.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Kind = Literal["pass", "fusion", "legalisation"]
KINDS: tuple[Kind, ...] = ("pass", "fusion", "legalisation")

__all__ = ["KINDS", "Kind", "Legalisation", "OrderError", "PassRewrite", "Rewrite", "counting", "ordered"]


class OrderError(ValueError):
    """``after`` names a rewrite that is not declared, or the ``after`` arrows make a circle."""


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """A named rewrite: what every kind shares."""

    name: str
    kind: Kind
    summary: str = ""
    # Names of rewrites of the same kind this one must run after (it builds on what they make).
    after: tuple[str, ...] = ()
    # Op keys it emits ('LayerNormalization', 'com.microsoft::BiasGelu').
    produces: tuple[str, ...] = ()
    # For the float model that ships only: precision quantises the graph from before it (its quantiser does
    # not know what this rewrite makes; ONNX Runtime's offline layout is the example).
    float_only: bool = False

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "summary": self.summary, "after": list(self.after),
                "produces": list(self.produces)}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PassRewrite(Rewrite):
    """A generic pass: ``make(options)`` returns the onnx_ir pass whose ``name`` is this rewrite's."""

    kind: Kind = "pass"
    make: Callable[[Any], Any]


@dataclass(frozen=True, kw_only=True)
class Legalisation(Rewrite):
    """A target's rewrite for its vendor's tools: ``apply(result, target) -> changed``. ``apply=None``: one of
    several names a single adapter step honours (the opset converter's decompositions), declared so that
    ``disabled_rules`` and the registry know it."""

    kind: Kind = "legalisation"
    apply: Callable[[Any, Any], Any] | None = None


def counting(name: str, rewrite: Callable[[Any], int], summary: str, *, note: str = "{name}: {count} node(s)",
             after: Sequence[str] = (), produces: Sequence[str] = ()) -> Legalisation:  # fmt: skip
    """A legalisation from ``rewrite(model) -> count of nodes rewritten``; ``note`` (with ``{name}`` and
    ``{count}``) goes to the legalisation notes when it rewrote any."""

    def apply(result, target) -> bool:
        count = rewrite(result.model)
        if count:
            result.notes.append(note.format(name=name, count=count))
        return bool(count)

    return Legalisation(name=name, summary=summary, apply=apply, after=tuple(after), produces=tuple(produces))


R = TypeVar("R", bound=Rewrite)


def ordered(rewrites: Iterable[R]) -> tuple[R, ...]:
    """``rewrites`` so that each comes after every one its ``after`` names (those present; a caller may pass a
    subset), ties in declaration order. Raises ``OrderError`` on a duplicate name or a circle, naming it."""
    items = list(rewrites)
    position: dict[str, int] = {}
    for index, rewrite in enumerate(items):
        if rewrite.name in position:
            raise OrderError(f"rewrite {rewrite.name!r} is declared twice")
        position[rewrite.name] = index
    waiting = {r.name: {a for a in r.after if a in position} for r in items}
    done: list[R] = []
    while len(done) < len(items):
        ready = next((r for r in items if r.name in waiting and not waiting[r.name]), None)
        if ready is None:
            raise OrderError(f"the 'after' arrows make a circle: {' -> '.join(_circle(waiting))}")
        done.append(ready)
        del waiting[ready.name]
        for rest in waiting.values():
            rest.discard(ready.name)
    return tuple(done)


def check_after(rewrites: Iterable[Rewrite]) -> None:
    """Every ``after`` names a declared rewrite of the same kind, and the whole set orders (no circle)."""
    items = list(rewrites)
    kinds = {r.name: r.kind for r in items}
    for rewrite in items:
        for name in rewrite.after:
            if kinds.get(name) != rewrite.kind:
                raise OrderError(f"{rewrite.kind} {rewrite.name!r} runs after {name!r}, which is not a "
                                 f"declared {rewrite.kind}")  # fmt: skip
    ordered(items)


def _circle(waiting: dict[str, set[str]]) -> list[str]:
    """One circle among the rewrites still waiting (each waits on one that waits...)."""
    start = next(iter(sorted(waiting)))
    path, seen = [start], {start}
    while True:
        following = sorted(waiting[path[-1]])[0]
        if following in seen:
            return [*path[path.index(following):], following]
        path.append(following)
        seen.add(following)
