"""Per-op int8 against fp32 on this CPU: which quantised nodes are measured slower in int8 and stay float.

The Fusion Switcher times a fusion against the nodes it replaces; this does the same for precision. The
fp32 model and its all-int8 static QDQ model (ONNX Runtime fuses the QDQ graph into QLinearConv,
MatMulIntegerToFloat... when it loads it) run in interleaved rounds at ORT_ENABLE_ALL, 1 thread, both with
ONNX Runtime's profiler on. Each profiled kernel is mapped back to the node of the fp32 graph it came from
(``attribute``): by name (ORT keeps the node's name or adds ``_token_N``, ``_nchwc``, ``/...Fusion/``), a
``<tensor>_QuantizeLinear`` to the quantised node that reads the tensor (the cost of entering int8), a
``<tensor>_DequantizeLinear`` to the one that wrote it (leaving int8), and a layout node (Transpose,
ReorderInput) to its nearest mapped neighbour in ORT's optimised graph. Per node and round:
``t_fp32[i]``, ``t_int8[i]``, then ``significance.paired`` with ``KERNEL_MIN_EFFECT``: a node whose int8
time is significantly more than its fp32 time stays float ("measured slower"); a tie keeps int8.

``decide`` is a pure function of those timings, so the same measurements always give the same decisions
(tests inject them); the timings are kept in the kernel cache per node (``precision.cache``), so a second compile
decides from the same figures without profiling. The whole model chosen is then timed against fp32 like every candidate: a per-op
decision cannot see every Q/DQ its neighbours' choices add, the never-slower guard does.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnxruntime as ort

from flexdsa_core.significance import KERNEL_MIN_EFFECT, Comparison, paired

__all__ = ["PROFILES", "OpDecision", "attribute", "decide", "profile_int8_vs_fp32", "quantised_nodes"]

# Model pairs this process has profiled (``profile_int8_vs_fp32``), by what: a compile whose per-op figures all
# come from the kernel cache adds nothing here.
PROFILES: Counter = Counter()

_QDQ = ("QuantizeLinear", "DequantizeLinear")
# Suffixes ONNX Runtime adds to a node's name when it rewrites it (layout transformers, fusions, copies).
_ORT_SUFFIX = re.compile(r"(_token_\d+|_nchwc|/duplicated|/\w*Fusion/?|_quant)$")
_OTHER = "(other)"


def quantised_nodes(quantized: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, op type) of the nodes a QDQ model computes in int8: those reading a DequantizeLinear."""
    dequantized = {node.output[0] for node in quantized.graph.node if node.op_type == "DequantizeLinear"}
    found = []
    for node in quantized.graph.node:
        if node.op_type in _QDQ:
            continue
        if any(name in dequantized for name in node.input):
            found.append((node.name, f"{node.domain}::{node.op_type}" if node.domain else node.op_type))
    return found


class _Graph:
    """Producers and consumers of a (float or QDQ) graph by tensor name."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.nodes = {node.name: node for node in model.graph.node}
        self.producer: dict[str, str] = {}
        self.consumers: dict[str, list[str]] = defaultdict(list)
        for node in model.graph.node:
            for name in node.output:
                self.producer[name] = node.name
            for name in node.input:
                if name:
                    self.consumers[name].append(node.name)


def _strip(name: str) -> str:
    previous = None
    while previous != name:
        previous, name = name, _ORT_SUFFIX.sub("", name)
    return name


def attribute(kernel_names: Sequence[str], source: onnx.ModelProto, layers: Sequence[str],
              optimized: onnx.ModelProto | None = None) -> dict[str, str]:  # fmt: skip
    """Kernel name (as ONNX Runtime's profiler writes it) -> the layer of ``source`` it belongs to, or
    ``"(other)"``: work of nodes that are not layers (float ops on either side, shape ops)."""
    graph, wanted = _Graph(source), set(layers)

    def owner_of_tensor(tensor: str, entering: bool) -> str | None:
        readers = [c for c in graph.consumers.get(tensor, []) if c in wanted]
        writer = graph.producer.get(tensor)
        if entering and readers:
            return readers[0]
        if writer in wanted:
            return writer
        # A tensor written by a node the quantiser folded away (Relu, Clip after a Conv): its input's writer.
        for _ in range(2):
            if writer is None or writer in wanted or not graph.nodes[writer].input:
                break
            writer = graph.producer.get(graph.nodes[writer].input[0])
            if writer in wanted:
                return writer
        return readers[0] if readers else None

    def by_name(kernel: str) -> str | None:
        stem = _strip(kernel)
        if stem in wanted:
            return stem
        for suffix, entering in (("_QuantizeLinear", True), ("_DequantizeLinear", False)):
            if stem.endswith(suffix):
                return owner_of_tensor(stem[: -len(suffix)], entering)
        if stem in graph.nodes:  # a float node that is not a layer
            return _OTHER
        if stem in graph.producer or stem in graph.consumers:  # named after its output tensor (NCHWc conv)
            return owner_of_tensor(stem, entering=False)
        return None

    owners = {kernel: by_name(kernel) for kernel in kernel_names}
    if optimized is not None:  # layout nodes ORT added: their nearest mapped neighbour in its graph
        ort_graph = _Graph(optimized)
        for kernel, owner in owners.items():
            if owner is not None or kernel not in ort_graph.nodes:
                continue
            node = ort_graph.nodes[kernel]
            near = [c for name in node.output for c in ort_graph.consumers.get(name, [])]
            near += [ort_graph.producer[name] for name in node.input if name in ort_graph.producer]
            for neighbour in near:
                found = owners.get(neighbour) or by_name(neighbour)
                if found and found != _OTHER:
                    owners[kernel] = found
                    break
    return {kernel: owner or _OTHER for kernel, owner in owners.items()}


def _profiled_session(path: Path, optimized: Path, prefix: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    options.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _per_run(profile: Path, skip: int) -> list[dict[str, float]]:
    """Seconds per kernel name for each run after the first ``skip`` (the k-th event of a kernel is run k)."""
    runs: list[dict[str, float]] = []
    seen: dict[str, int] = defaultdict(int)
    for event in json.loads(profile.read_text()):
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        kernel = name[: -len("_kernel_time")]
        index = seen[kernel]
        seen[kernel] += 1
        if index < skip:
            continue
        while len(runs) <= index - skip:
            runs.append({})
        runs[index - skip][kernel] = runs[index - skip].get(kernel, 0.0) + event.get("dur", 0) * 1e-6
    profile.unlink(missing_ok=True)
    return runs


def profile_int8_vs_fp32(fp32: Path, int8: Path, layers: Sequence[str], feed: Mapping, workdir: Path, *,
                         rounds: int, warmup: int = 3) -> dict[str, tuple[list[float], list[float]]]:  # fmt: skip
    """Per layer, its seconds in each round: (fp32 side, int8 side), from interleaved profiled runs."""
    PROFILES["int8_vs_fp32"] += 1
    sessions = {}
    for side, path in (("fp32", fp32), ("int8", int8)):
        optimized = workdir / f"ort_{side}_optimized.onnx"
        sessions[side] = (_profiled_session(path, optimized, workdir / f"profile_{side}"), optimized)
    for index in range(warmup + rounds):
        order = ("fp32", "int8") if index % 2 == 0 else ("int8", "fp32")
        for side in order:
            sessions[side][0].run(None, dict(feed))
    per_layer: dict[str, tuple[list[float], list[float]]] = {name: ([0.0] * rounds, [0.0] * rounds) for name in layers}
    source = onnx.load(str(fp32), load_external_data=False)
    for position, side in enumerate(("fp32", "int8")):
        sess, optimized_path = sessions[side]
        runs = _per_run(Path(sess.end_profiling()), warmup)[:rounds]
        optimized = onnx.load(str(optimized_path), load_external_data=False)
        optimized_path.unlink(missing_ok=True)
        kernels = sorted({kernel for run in runs for kernel in run})
        owners = attribute(kernels, source, layers, optimized)
        for index, run in enumerate(runs):
            for kernel, seconds in run.items():
                owner = owners[kernel]
                if owner in per_layer:
                    per_layer[owner][position][index] += seconds
    return per_layer


@dataclass(frozen=True)
class OpDecision:
    """One quantised node's measured int8 and fp32 time on this CPU, and the precision it is given."""

    layer: str
    precision: str  # "int8" or "float32"
    reason: str
    fp32_ms: float | None
    int8_ms: float | None
    comparison: Comparison | None

    def columns(self) -> dict:
        entry = {"fp32_ms": self.fp32_ms, "int8_ms": self.int8_ms, "measured": "not timed"}
        if self.comparison is not None:
            entry["measured"] = self.comparison.verdict
            entry["int8_vs_fp32"] = round(self.comparison.ratio, 4)
            entry["int8_vs_fp32_ci"] = [round(self.comparison.low, 4), round(self.comparison.high, 4)]
        return entry


def decide(timings: Mapping[str, tuple[Sequence[float], Sequence[float]]],
           min_effect: float = KERNEL_MIN_EFFECT) -> dict[str, OpDecision]:  # fmt: skip
    """int8 or float per layer from its per-round (fp32, int8) seconds: float only where int8 is
    significantly slower; a layer with no kernel time on either side (folded away, or not mapped) keeps
    int8 and says it was not timed. Sorted by name, so equal inputs give equal outputs."""
    decisions = {}
    for layer in sorted(timings):
        fp32_times, int8_times = timings[layer]
        if not any(fp32_times) or not any(int8_times):
            missing = " and ".join(side for side, times in (("fp32", fp32_times), ("int8", int8_times)) if not any(times))
            decisions[layer] = OpDecision(
                layer, "int8", f"not timed: no kernel of its own in the {missing} model (folded into a neighbour)",
                round(statistics.median(fp32_times) * 1e3, 4) if fp32_times else None,
                round(statistics.median(int8_times) * 1e3, 4) if int8_times else None, None,
            )  # fmt: skip
            continue
        comparison = paired(fp32_times, int8_times, min_effect=min_effect)
        fp32_ms, int8_ms = round(comparison.first_s * 1e3, 4), round(comparison.second_s * 1e3, 4)
        figures = (
            f"int8 {int8_ms:.3f} ms vs fp32 {fp32_ms:.3f} ms, ratio {comparison.ratio:.2f} "
            f"[{comparison.low:.2f}, {comparison.high:.2f}] over {comparison.rounds} rounds"
        )
        if comparison.verdict == "slower":
            decisions[layer] = OpDecision(
                layer, "float32", f"measured slower: {figures}", fp32_ms, int8_ms, comparison
            )
        else:
            how = "measured faster" if comparison.verdict == "faster" else "no significant difference (tie keeps int8)"
            decisions[layer] = OpDecision(layer, "int8", f"{how}: {figures}", fp32_ms, int8_ms, comparison)
    return decisions
