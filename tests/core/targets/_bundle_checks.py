"""What the vendor-target tests (rockchip, qualcomm, amd, xilinx) share: an adapter's reason for a node,
the constants of a generated script, and, with a vendor toolchain installed, a bucket run through its
driver or a fixture optimised with it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_core.toolchains import Toolchain, get_toolchain
from tests.core.fusions.harness import parse
from tests.models import fixture

TOOLCHAIN_ROOT = Path.home() / ".cache" / "flexdsa" / "toolchains"

CONV_RELU = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 3, 16, 16] x, float[8, 3, 3, 3] w, float[8] b) => (float[1, 8, 16, 16] y)
{ c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
  y = Relu (c) }
"""


def fallback_reason(adapter, target, text: str, op_type: str) -> str | None:
    """The adapter's reason to put the first ``op_type`` node of the ONNX text on the CPU (None: it stays on
    the accelerator), after legalisation names the nodes as the pipeline does."""
    model = ir.from_proto(parse(text))
    adapter.legalize(model, target, frozenset())
    node = next(n for n in model.graph if n.op_type == op_type)
    return adapter.fallback_reason(node, target)


def script_constants(script: str, start: str, end: str) -> dict:
    """The names a generated script defines between ``start`` and ``end`` (its BUCKETS, CONFIG, ...)."""
    namespace: dict = {}
    exec(script[script.index(start) : script.index(end)], namespace)
    return namespace


def conv_relu(rng: np.random.Generator) -> onnx.ModelProto:
    """A padded 3x3 Conv + Relu on a 1x3x16x16 input, its weight and bias drawn from ``rng`` (in that order)
    as initializers."""
    proto = parse(CONV_RELU)
    for name, shape in (("w", (8, 3, 3, 3)), ("b", (8,))):
        array = rng.standard_normal(shape).astype(np.float32)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    return proto


def cosine(want, got) -> float:
    want, got = np.ravel(want), np.ravel(got)
    return float(want @ got / np.linalg.norm(want) / np.linalg.norm(got))


# ---- with a vendor toolchain installed ---------------------------------------------------------------


def toolchain_or_skip(name: str, package: str) -> Toolchain:
    """The named toolchain, or skip the test (saying how to install it) where it is not ready here, or where
    ``FLEXDSA_TEST_TOOLCHAINS=skip`` (``make test-fast``: vendor compilers take seconds per test)."""
    if os.environ.get("FLEXDSA_TEST_TOOLCHAINS") == "skip":
        pytest.skip("vendor toolchains skipped (FLEXDSA_TEST_TOOLCHAINS=skip)")
    toolchain = get_toolchain(name)
    status = toolchain.status(TOOLCHAIN_ROOT)
    if not status.ready:
        pytest.skip(f"{package} is not installed ({status.detail}): run `{toolchain.install_command()}`")
    return toolchain


def run_bucket(toolchain: Toolchain, target, onnx_path: Path, feeds: dict, workdir: Path, options: dict,
               name: str = "b") -> dict:  # fmt: skip
    """One bucket through the toolchain's driver: ``feeds`` saved as ``workdir/<input>.npy``, the driver's
    files under ``workdir/out``; returns the driver's entry for the bucket."""
    inputs = {}
    for input_name, array in feeds.items():
        inputs[input_name] = str(workdir / f"{input_name}.npy")
        np.save(inputs[input_name], array)
    request = {"action": "compile", "target": target.model_dump(mode="json"), "out_dir": str(workdir / "out"),
               "buckets": [{"name": name, "onnx": str(onnx_path), "inputs": inputs}],
               "options": options}  # fmt: skip
    [bucket] = toolchain.run(TOOLCHAIN_ROOT, request, workdir=workdir)["buckets"]
    return bucket


def optimized_with_toolchain(target: str, name: str, **options):
    """The fixture ``name`` optimised for ``target`` (a request as the API takes it) with the vendor
    toolchain; returns the result and its report's toolchain section, which must say the toolchain ran."""
    request = RequestSpec.model_validate({"target": target, "measure_latency": False, **options})
    result = FlexDSAOptimizer(request.target_spec(), toolchain_root=TOOLCHAIN_ROOT).optimize(
        fixture(name), request.options()
    )
    toolchain = result.report["toolchain"]
    assert toolchain["ran"], toolchain
    return result, toolchain
