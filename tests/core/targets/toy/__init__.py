"""A toy vendor package outside ``flexdsa_core/targets/`` (registered with ``targets.register_vendor``): its spec
``toy-npu.json`` and an adapter whose pipeline is the default plus one stage and one verifier of its own,
registered here, beside the adapter that lists them."""

from __future__ import annotations

from collections import Counter

from flexdsa_core.pipeline import stage
from flexdsa_core.targets import PlatformAdapter, TargetSpec
from flexdsa_core.verify import Verdict, Verifier, verifier


@stage("toy_census")
def toy_census(run) -> None:
    """Counts the ops each bucket ends with, into its legalisation notes (what the report shows per bucket)."""
    counts = Counter(node.op_type for node in run.model.graph)
    run.comp.legalization.setdefault(run.bucket.name, []).append(f"toy census: {dict(sorted(counts.items()))}")


@verifier("toy_op_table")
class ToyOpTable(Verifier):
    """Every node of every bucket is in the toy's op table."""

    name, stage = "toy_op_table", "toy"

    def verify(self, job) -> Verdict:
        target, adapter = job.optimizer.target, job.optimizer.adapter
        outside = sorted(
            {node.op_type for b in job.comp.buckets for node in b.model.graph if not adapter.supports(target, node.op_type, node.domain)}
        )
        return Verdict(not outside, {"outside_the_table": outside}, f"not in the op table: {outside}" if outside else None)


class ToyAdapter(PlatformAdapter):
    vendor = "toy"

    def stages(self, target: TargetSpec) -> tuple[str, ...]:
        default = super().stages(target)
        # The census after legalisation, on the graph that ships.
        return (*default[: default.index("legalize") + 1], "toy_census", *default[default.index("legalize") + 1 :])

    def verifiers(self, target: TargetSpec) -> tuple[str, ...]:
        return (*super().verifiers(target), "toy_op_table")


ADAPTER = ToyAdapter()
