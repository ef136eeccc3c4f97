"""What the vendor-target tests (rockchip, qualcomm, amd, xilinx) share: an adapter's reason for a node,
the constants of a generated script, and, with a vendor toolchain installed, a bucket run through its
driver or a fixture optimised with it."""

from __future__ import annotations

import os
import subprocess
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
               name: str = "b", samples: list[dict] = ()) -> dict:  # fmt: skip
    """One bucket through the toolchain's driver: ``feeds`` saved as ``workdir/<input>.npy``, the driver's
    files under ``workdir/out``; ``samples`` (input name -> array), where given, are the bucket's calibration
    samples and the samples it is judged on, as the core hands them over. Returns the driver's entry."""
    inputs = {}
    for input_name, array in feeds.items():
        inputs[input_name] = str(workdir / f"{input_name}.npy")
        np.save(inputs[input_name], array)
    bucket = {"name": name, "onnx": str(onnx_path), "inputs": inputs}
    if samples:
        listed = []
        for index, sample in enumerate(samples):
            listed.append({key: str(workdir / f"sample{index:03d}.{key}.npy") for key in sample})
            for key, array in sample.items():
                np.save(listed[-1][key], array)
        bucket.update(dataset=listed, samples=listed)
    request = {"action": "compile", "target": target.model_dump(mode="json"), "out_dir": str(workdir / "out"),
               "buckets": [bucket], "options": options}  # fmt: skip
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


# ---- a bundle from a mixed plan, and its vendor script run ---------------------------------------------


def mixed_bundle(target: str, folder: Path) -> dict:
    """The sensitive MLP (``tests.core.test_precision``: the stand-in search keeps 'widen' and 'sensitive' out of
    int8) optimised for ``target`` with ``precision: mixed`` on its calibration samples, the vendor toolchain not
    run; its bundle written under ``folder``. Returns the report."""
    from tests.core.test_precision import _mlp_calibration, _sensitive_mlp

    request = RequestSpec.model_validate(
        {"target": target, "measure_latency": False, "precision": "mixed", "accuracy": {"top1_outputs": []}}
    )
    result = FlexDSAOptimizer(request.target_spec()).optimize(
        _sensitive_mlp(), request.options(), calibration=_mlp_calibration()
    )
    for name, content in result.artifacts.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.read_bytes() if isinstance(content, Path) else content)
    precision = result.report["precision"]
    assert precision["float_layers"] == ["widen", "sensitive"], precision.get("float_layers")
    return result.report


def run_script(toolchain: Toolchain, folder: Path, *args: str, timeout: float = 300) -> str:
    """A bundle's vendor script run in the toolchain's environment, in the bundle's folder; its output."""
    done = subprocess.run(
        [str(toolchain.python(TOOLCHAIN_ROOT)), *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def quantize_types(path: Path) -> dict[str, int]:
    """In a QDQ model, each quantised tensor -> its zero point's ONNX dtype (``onnx.TensorProto``): an activation
    under its QuantizeLinear's input (a graph output, which the quantiser renames, under its own name), a weight
    under its initializer's name."""
    model = onnx.load(str(path))
    zero_points = {init.name: init.data_type for init in model.graph.initializer}
    outputs = {value.name for value in model.graph.output}
    dequantized = {
        node.input[0]: node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear"
    }
    found = {}
    for node in model.graph.node:
        if len(node.input) < 3:
            continue
        if node.op_type == "QuantizeLinear":
            output = dequantized.get(node.output[0])
            found[output if output in outputs else node.input[0]] = zero_points.get(node.input[2])
        elif node.op_type == "DequantizeLinear" and node.input[0] in zero_points:
            found[node.input[0].removesuffix("_quantized")] = zero_points.get(node.input[2])
    return found
