"""The one registry of rewrites for a target: its generic passes, fusion rules and legalisations.

Every rewrite is a ``rewrites.Rewrite`` declared where its code is (``passes/__init__.py``, one module per
rule under ``fusions/``, the adapter's ``legalisations``). ``Registry(target)`` gathers them, checks that
every ``after`` names a declared rewrite of its kind and that no name is used twice, and is what
``disabled_rules`` (``preflight.check_disabled``), ``GET /targets/{name}`` (``switchable_names``), the
optimizer's stages, bisection and report read.

Adding one is one declared object plus its test: a ``PassRewrite`` in ``GENERIC_PASSES``, a module under
``fusions/`` exporting ``RULES = [make_rule(...)]``, or a ``Legalisation`` in an adapter's ``legalisations``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from flexdsa_core.fusions import FusionRule, discover_rules
from flexdsa_core.passes import GENERIC_PASSES
from flexdsa_core.rewrites import Kind, Legalisation, OrderError, PassRewrite, Rewrite, check_after, ordered
from flexdsa_core.targets import get_adapter, load_target
from flexdsa_core.targets.spec import TargetSpec

__all__ = ["SWITCHABLE_KEYS", "Registry"]

# The keys ``switchable_names`` (and ``GET /targets/{name}``) groups the names under, by kind.
SWITCHABLE_KEYS: dict[Kind, str] = {"pass": "passes", "fusion": "fusions", "legalisation": "target"}


class Registry:
    """The rewrites one target runs, each kind in its own order. ``rules`` replaces the discovered fusion
    rules (tests and experiments)."""

    def __init__(self, target: TargetSpec | str, rules: Sequence[FusionRule] | None = None) -> None:
        self.target = load_target(target) if isinstance(target, str) else target
        self.passes: tuple[PassRewrite, ...] = ordered(GENERIC_PASSES)
        self.fusions: tuple[FusionRule, ...] = ordered(rules) if rules is not None else discover_rules()
        self.legalisations: tuple[Legalisation, ...] = ordered(get_adapter(self.target).legalisations)

    @cached_property
    def all(self) -> tuple[Rewrite, ...]:
        return (*self.passes, *self.fusions, *self.legalisations)

    @cached_property
    def by_name(self) -> dict[str, Rewrite]:
        found: dict[str, Rewrite] = {}
        for rewrite in self.all:
            if rewrite.name in found:
                raise OrderError(f"rewrite name {rewrite.name!r} is declared as a {found[rewrite.name].kind} and "
                                 f"as a {rewrite.kind}")  # fmt: skip
            found[rewrite.name] = rewrite
        return found

    def check(self) -> None:
        """Every name once, every ``after`` a declared rewrite of the same kind, no circle."""
        self.by_name  # noqa: B018 - builds the name table, refusing a name declared twice
        for kind in SWITCHABLE_KEYS:
            check_after(r for r in self.all if r.kind == kind)

    def names(self) -> dict[str, list[str]]:
        """Every name ``disabled_rules`` accepts, by kind, in the order each kind runs."""
        return {key: [r.name for r in self.all if r.kind == kind] for kind, key in SWITCHABLE_KEYS.items()}

    def kind_of(self, name: str) -> Kind | None:
        rewrite = self.by_name.get(name)
        return rewrite.kind if rewrite is not None else None

    def float_only(self) -> frozenset[str]:
        """Rewrites for the shipped float model only: the precision stage quantises the graph without them."""
        return frozenset(r.name for r in self.all if r.float_only)

    def producing(self, op_keys: frozenset[str] | set[str]) -> frozenset[str]:
        """Rewrites that emit any of ``op_keys``."""
        return frozenset(r.name for r in self.all if set(r.produces) & set(op_keys))
