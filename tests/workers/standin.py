"""A stand-in for ``FlexDSAOptimizer`` with the same contract, for worker tests that must be fast and
deterministic (fault injection, time limits). The child process loads it through the test-only
``FLEXDSA_TEST_OPTIMIZER=tests.workers.standin:StandInOptimizer`` hook.

It walks five stages, reports progress, and treats every node of the model as a kernel: the key is the
node's op type and attributes (no weights), looked up in the cache it is given; a miss "measures" the
kernel (a short sleep) and stores the measurement. A model whose bytes start with ``b"bad"`` raises
``InvalidModelError``, like the real core on a malformed upload; one starting with ``b"bug"`` raises a
``RuntimeError``, like a bug in the core (an internal error with an incident).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from flexdsa_core.cache import kernel_key
from flexdsa_core.errors import InvalidModelError

# A valid ONNX model whose graph has this name aborts the pipeline process every time (bench.soak's poison).
POISON_GRAPH = "flexdsa-poison"
# A valid ONNX model whose graph has this name meets a bug (an incident), like a ``b"bug"`` file, but gets
# past the API's check that an upload is ONNX.
BUG_GRAPH = "flexdsa-bug"
# The real pipeline's stage names (tests/workers/test_standin_contract.py checks they stay a subset).
STAGES = ("ingest", "shapes", "passes", "fusion", "validate")
MEASURE_S = 0.02


@dataclass
class StandInResult:
    artifacts: dict[str, bytes]
    report: dict = field(default_factory=dict)

    def report_summary(self) -> dict:
        return {"kernels": self.report["kernels"], "cache_hits": self.report["cache_hits"]}


class StandInOptimizer:
    def __init__(self, target, *, toolchain_root=None) -> None:
        self.target = target

    def optimize(
        self, model, options=None, *, cache=None, progress=None, workdir=None, calibration=None
    ) -> StandInResult:
        from flexdsa_core.cache import LRUCache

        cache = LRUCache() if cache is None else cache
        progress = progress or (lambda *_args: None)
        data = Path(model).read_bytes()
        if data.startswith(b"bad"):
            raise InvalidModelError("not an ONNX model: the upload does not parse as protobuf")
        if data.startswith(b"bug") or _graph_name(data) == BUG_GRAPH:  # a bug in the compiler, not the user's mistake: an incident
            raise RuntimeError("deliberate bug in the stand-in optimizer")
        progress(STAGES[0], 0.0, "reading the model")
        if _graph_name(data) == POISON_GRAPH:  # kills its process on every attempt, like a model crashing ORT
            os.abort()
        kernels = _kernels(data)
        hits = 0
        for index, stage in enumerate(STAGES[1:], start=1):
            progress(stage, index / len(STAGES), f"stage {stage}")
        for kernel in kernels:
            key = kernel_key(kernel, self.target, "standin")
            if cache.get(key) is not None:
                hits += 1
                if hasattr(cache, "saved"):
                    cache.saved(MEASURE_S)
                continue
            time.sleep(MEASURE_S)
            cache.put(key, json.dumps({"latency_us": 1.0}).encode())
        progress("report", 1.0, "done")
        report = {"kernels": len(kernels), "cache_hits": hits, "model_sha256": hashlib.sha256(data).hexdigest()}
        return StandInResult(
            artifacts={
                "model.onnx": data,
                "report.json": json.dumps(report).encode(),
                "manifest.json": json.dumps({"target": self.target.name}).encode(),
            },
            report=report,
        )


def _graph_name(data: bytes) -> str:
    import onnx

    try:
        return onnx.load_from_string(data).graph.name
    except Exception:  # noqa: BLE001 - not a model: _kernels reports it
        return ""


def _kernels(data: bytes) -> list[dict]:
    import onnx

    model = onnx.load_from_string(data)
    return [
        {"op": node.op_type, "attrs": sorted(str(a) for a in node.attribute)} for node in model.graph.node
    ]
