"""What a vendor's own compiler says one compiled model costs: the figure exploration is scored by.

``VendorCost`` is read from one driver entry by the target's adapter (``AcceleratorAdapter.vendor_cost``):
rknn-toolkit2's per-layer cycle table, QNN's placement. ``cycles`` is None where the vendor gives no cost
figure (then only placement can be compared). ``per_node`` attributes each layer's cycles to the ONNX nodes
it came from, so a candidate's cost can be read per rewrite site (``site_cycles``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class VendorCost:
    cycles: float | None
    cpu_nodes: int
    transitions: int | None  # None where the vendor's report gives no execution order (QNN)
    source: str  # "rknn-toolkit2 2.5.0 estimate (...)": what produced the figure, shown beside it everywhere
    layers: int = 0
    # Per layer: (cycles, ONNX node names it came from). Layers the vendor left untraceable carry no names.
    per_layer: tuple[tuple[float, tuple[str, ...]], ...] = field(default=(), repr=False)
    cpu_layers: tuple[str, ...] = ()  # what runs on the CPU beside the accelerator, in the vendor's words

    def site_cycles(self, nodes: set[str]) -> float:
        """Cycles of the layers that came from any of ``nodes`` (a rewrite site and the nodes it added)."""
        return sum(cycles for cycles, names in self.per_layer if nodes.intersection(names))

    def as_dict(self) -> dict:
        return {
            "cycles": self.cycles,
            "cpu_nodes": self.cpu_nodes,
            "transitions": self.transitions,
            "layers": self.layers,
            "cpu_layers": list(self.cpu_layers),
            "source": self.source,
        }


def ratio(ours: VendorCost | None, theirs: VendorCost | None) -> float | None:
    """ours / theirs in the vendor's own unit; None where either has no figure."""
    if ours is None or theirs is None or ours.cycles is None or not theirs.cycles:
        return None
    return ours.cycles / theirs.cycles
