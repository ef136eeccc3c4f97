"""nvidia-orin-nano: TensorRT legalisation (LayerNormalization Y only, Compress as Gather, opset into 9-20)
with equal numerics, the op-matrix restrictions as fallback reasons, and the generated trtexec script and
engine builder: its plan against the bundle and its calls driven against a stand-in ``tensorrt`` here; a real
engine only on an NVIDIA GPU (CI has none: that test says so when it skips)."""

import json
import py_compile
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.targets import BucketModel, get_adapter, load_target
from flexdsa_core.targets.nvidia.adapter import profile
from tests.core.fusions.harness import _random_inputs, op_types, parse, run
from tests.models import fixture

TARGET = load_target("nvidia-orin-nano")
ADAPTER = get_adapter(TARGET)


def legalize(text: str, disabled: frozenset[str] = frozenset()):
    proto = parse(text)
    return proto, ADAPTER.legalize(ir.from_proto(proto), TARGET, disabled)


def assert_same_numerics(original: onnx.ModelProto, lowered: onnx.ModelProto, feeds=None) -> None:
    feeds = feeds or _random_inputs(original)
    for expected, got in zip(run(original, feeds), run(lowered, feeds), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def reason(text: str, index: int = 0) -> str | None:
    node = list(ir.from_proto(parse(text)).graph)[index]
    return ADAPTER.fallback_reason(node, TARGET)


def test_layer_norm_keeps_only_y():
    original, result = legalize("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4, 8] x, float[8] s, float[8] b) => (float[2, 4, 8] y)
{ y, mean, inv = LayerNormalization (x, s, b) }
""")
    assert result.applied == ["layer_norm_y_only"]
    lowered = ir.to_proto(result.model)
    assert list(lowered.graph.node[0].output) == ["y"]
    assert ADAPTER.fallback_reason(next(iter(result.model.graph)), TARGET) is None
    assert_same_numerics(original, lowered)


def test_used_layer_norm_statistics_fall_back():
    assert "only the first output Y" in reason("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 8] x, float[8] s) => (float[2, 8] y, float[2, 1] mean)
{ y, mean = LayerNormalization (x, s) }
""")


@pytest.mark.parametrize("axis", ["<axis: int = 1>", ""])
def test_compress_becomes_gather(axis):
    original, result = legalize(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[3, 5] x, bool[5] c) => (float[3, N] y)
{{ y = Compress {axis} (x, c) }}
""")
    lowered = ir.to_proto(result.model)
    assert result.applied == ["compress_to_gather"]
    assert "Compress" not in op_types(lowered) and {"NonZero", "Gather"} <= set(op_types(lowered))
    assert set(op_types(lowered)) <= set(TARGET.supported_ops)
    feeds = {"x": np.arange(15, dtype=np.float32).reshape(3, 5), "c": np.array([1, 0, 1, 1, 0], dtype=bool)}
    assert_same_numerics(original, lowered, feeds)


def test_rms_norm_23_is_lowered_to_opset_20():
    original, result = legalize("""
<ir_version: 10, opset_import: ["" : 23]>
g (float[2, 6, 8] x, float[8] s) => (float[2, 6, 8] y)
{ y = RMSNormalization <epsilon: float = 0.001> (x, s) }
""")
    lowered = ir.to_proto(result.model)
    assert lowered.opset_import[0].version == 20 and "rms_norm_decompose" in result.applied
    assert_same_numerics(original, lowered)


def test_topk_k_4000_falls_back():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 5000] x) => (float[1, {k}] v, int64[1, {k}] i)
<int64[1] k = {{{k}}}>
{{ v, i = TopK (x, k) }}
"""
    assert reason(text.format(k=4000)) == "TopK: K = 4000 is not below 3840, TensorRT's limit (N5)"
    assert reason(text.format(k=100)) is None


def test_matrix_restrictions():
    pool_1d = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 4, 16] x) => (float[1, 4, 8] y)
{ y = MaxPool <kernel_shape: ints = [2], strides: ints = [2]> (x) }
"""
    assert "2D or 3D only" in reason(pool_1d)
    cubic = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 1, 4, 4] x) => (float[1, 1, 8, 8] y)
<float[4] scales = {1.0, 1.0, 2.0, 2.0}>
{ y = Resize <mode: string = "cubic"> (x, , scales) }
"""
    assert "mode='cubic' is not supported" in reason(cubic) and "(N5)" in reason(cubic)
    asymmetric = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[4] x) => (uint8[4] q)
<float s = {0.1}, uint8 zp = {128}>
{ q = QuantizeLinear (x, s, zp) }
"""
    assert "symmetric quantisation only" in reason(asymmetric)
    pad_axes = """
<ir_version: 9, opset_import: ["" : 18]>
g (float[2, 4] x, int64[1] axes) => (float[2, 6] y)
<int64[2] pads = {1, 1}>
{ y = Pad (x, pads, , axes) }
"""
    assert "input 3 ('axes') must be a constant" in reason(pad_axes)
    assert "Unique is not in the nvidia-orin-nano op table" in reason("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[6] x) => (float[N] y)
{ y = Unique (x) }
""")


def _buckets(seqs: list[int], batches: list[int] = (1,)) -> list[BucketModel]:
    buckets = []
    for batch in batches:
        for seq in seqs:
            proto = parse(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (int64[{batch}, {seq}] ids, float[{batch}, 3, 8, 8] pixels) => (int64[{batch}, {seq}] z, float[{batch}, 3, 8, 8] y)
{{ z = Identity (ids)
  y = Relu (pixels) }}
""")
            buckets.append(BucketModel(f"batch{batch}_seq{seq}", ir.from_proto(proto), {}))
    return buckets


def test_profile_spans_the_buckets_with_opt_first():
    span = profile(_buckets([64, 128, 32], batches=[1, 4]))
    assert span["ids"] == {"min": [1, 32], "opt": [1, 64], "max": [4, 128]}
    assert span["pixels"] == {"min": [1, 3, 8, 8], "opt": [1, 3, 8, 8], "max": [4, 3, 8, 8]}
    for shapes in span.values():
        assert all(
            lo <= opt <= hi for lo, opt, hi in zip(shapes["min"], shapes["opt"], shapes["max"], strict=True)
        )


def test_trtexec_script_and_engine_builder(tmp_path):
    report = {"reproducibility": {"options": {"precision": "fp16"}}}
    files = ADAPTER.vendor_files(_buckets([64, 128]), TARGET, report)
    assert set(files) == {"trtexec.sh", "build_engine.py"}
    script = tmp_path / "trtexec.sh"
    script.write_bytes(files["trtexec.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = files["trtexec.sh"].decode()
    assert "--onnx=model.batch1_seq64.onnx" in text and "--saveEngine=model.batch1_seq128.plan" in text
    assert "\nPRECISION_FLAGS=${PRECISION_FLAGS---fp16}\n" in text  # an assignment: one word, unquoted
    assert "--minShapes=ids:1x64,pixels:1x3x8x8" in text and "--maxShapes=ids:1x128,pixels:1x3x8x8" in text
    assert "--memPoolSize=workspace:" in text

    builder = tmp_path / "build_engine.py"
    builder.write_bytes(files["build_engine.py"])
    py_compile.compile(str(builder), doraise=True)
    namespace = {"__name__": "bundle", "__file__": str(builder)}
    exec(compile(files["build_engine.py"], str(builder), "exec"), namespace)  # module level only: no tensorrt
    assert namespace["PROFILE"]["ids"]["max"] == [1, 128] and namespace["PRECISION"] == "fp16"
    help_text = subprocess.run(
        [sys.executable, str(builder), "--help"], capture_output=True, text=True, check=True
    )
    assert "--dynamic" in help_text.stdout


def test_trtexec_script_runs_with_a_stand_in_trtexec(tmp_path):
    files = ADAPTER.vendor_files(
        _buckets([64, 128]), TARGET, {"reproducibility": {"options": {"precision": "fp16"}}}
    )
    (tmp_path / "trtexec.sh").write_bytes(files["trtexec.sh"])
    record = tmp_path / "argv.txt"
    fake = tmp_path / "bin" / "trtexec"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> {record}\necho --- >> {record}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    subprocess.run(["bash", str(tmp_path / "trtexec.sh")], check=True, env=env, cwd="/")
    subprocess.run(["bash", str(tmp_path / "trtexec.sh"), "dyn.onnx"], check=True, env=env, cwd=str(tmp_path))
    calls = [call.strip().splitlines() for call in record.read_text().split("---") if call.strip()]
    assert calls[0] == [
        "--onnx=model.batch1_seq64.onnx",
        "--saveEngine=model.batch1_seq64.plan",
        "--memPoolSize=workspace:1024",
        "--fp16",
    ]
    assert (
        calls[2][0] == f"--onnx={tmp_path / 'dyn.onnx'}" and "--optShapes=ids:1x64,pixels:1x3x8x8" in calls[2]
    )


# ---- build_engine.py: its plan against the bundle, and what it asks of TensorRT -----------------------

FP16 = {"reproducibility": {"options": {"precision": "fp16"}}}

# A stand-in for the ``tensorrt`` package (the calls build_engine.py makes, as TensorRT 10 names them): it
# parses nothing but the ONNX inputs' shapes, and logs what the script asked for, so the test holds the script's
# choices (which ONNX file per engine, flags, workspace, profile) against its plan. The engine it writes is a
# placeholder naming the ONNX file it came from; a real engine needs the GPU test below.
STAND_IN_TENSORRT = """
import json, os
import onnx

__version__ = "10.0.0"


class Logger:
    WARNING = 2

    def __init__(self, level):
        pass


class NetworkDefinitionCreationFlag:
    EXPLICIT_BATCH = 0


class MemoryPoolType:
    WORKSPACE = "workspace"


class BuilderFlag:
    FP16, INT8 = "fp16", "int8"


class _Tensor:
    def __init__(self, name, shape):
        self.name, self.shape = name, tuple(shape)


class _Network:
    def __init__(self):
        self.inputs, self.parsed = [], None

    @property
    def num_inputs(self):
        return len(self.inputs)

    def get_input(self, index):
        return self.inputs[index]


class OnnxParser:
    num_errors = 0

    def __init__(self, network, logger):
        self.network = network

    def parse_from_file(self, path):
        graph = onnx.load(path).graph
        for value in graph.input:
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]
            self.network.inputs.append(_Tensor(value.name, dims))
        self.network.parsed = os.path.basename(path)
        return True


class _Profile:
    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, low, opt, high):
        self.shapes[name] = [list(low), list(opt), list(high)]


class _Config:
    def __init__(self):
        self.flags, self.workspace, self.profiles = [], None, []

    def set_memory_pool_limit(self, pool, size):
        self.workspace = size

    def set_flag(self, flag):
        self.flags.append(flag)

    def add_optimization_profile(self, profile):
        self.profiles.append(profile.shapes)


class Builder:
    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return _Network()

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        with open(os.environ["STAND_IN_TENSORRT_LOG"], "a") as log:
            log.write(json.dumps({"onnx": network.parsed, "flags": config.flags, "workspace": config.workspace,
                                  "profiles": config.profiles}) + "\\n")
        return ("placeholder engine from " + network.parsed).encode()
"""


def _bundle(folder, buckets, report) -> dict:
    files = ADAPTER.generate(buckets, TARGET, report)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return json.loads(files["manifest.json"])


def _plan(folder) -> dict:
    """build_engine.py's module-level plan (BUCKETS, PROFILE, PRECISION, WORKSPACE_MIB): no tensorrt needed."""
    namespace = {"__name__": "bundle", "__file__": str(folder / "build_engine.py")}
    exec(compile((folder / "build_engine.py").read_text(), "build_engine.py", "exec"), namespace)
    return namespace


def _span(manifest: dict) -> dict:
    """Per input, the min/opt/max the manifest's buckets give: elementwise min and max, opt the first bucket."""
    shapes: dict[str, list[list[int]]] = {}
    for bucket in manifest["buckets"]:
        for value in bucket["inputs"]:
            shapes.setdefault(value["name"], []).append(value["shape"])
    return {
        name: {"min": [min(d) for d in zip(*seen)], "opt": seen[0], "max": [max(d) for d in zip(*seen)]}
        for name, seen in shapes.items()
    }


def test_engine_builder_plan_matches_the_bundle(tmp_path):
    from flexdsa_core.targets.nvidia.adapter import WORKSPACE_MIB

    manifest = _bundle(tmp_path, _buckets([64, 128]), FP16)
    py_compile.compile(str(tmp_path / "build_engine.py"), doraise=True)
    plan = _plan(tmp_path)
    assert manifest["buckets"], "expected the bundle's manifest to list its buckets"
    assert [b["name"] for b in plan["BUCKETS"]] == [b["name"] for b in manifest["buckets"]]
    for planned, listed in zip(plan["BUCKETS"], manifest["buckets"], strict=True):
        assert planned["onnx"] == listed["file"] and (tmp_path / planned["onnx"]).is_file()
        assert planned["engine"] == f"model.{listed['name']}.plan"
        assert planned["inputs"] == {value["name"]: value["shape"] for value in listed["inputs"]}
    span = {name: {k: list(v) for k, v in shapes.items()} for name, shapes in plan["PROFILE"].items()}
    assert span == _span(manifest) and span["ids"] == {"min": [1, 64], "opt": [1, 64], "max": [1, 128]}
    assert plan["PRECISION"] == "fp16" and plan["WORKSPACE_MIB"] == WORKSPACE_MIB
    readme = (tmp_path / "README.md").read_text()
    assert all(f"`{planned['engine']}`" in readme for planned in plan["BUCKETS"])  # the engines it names


def _build(folder, *args: str) -> list[dict]:
    """build_engine.py run with the stand-in tensorrt; what it asked the builder for, engine by engine."""
    stand_in = folder / "stand_in" / "tensorrt"
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "__init__.py").write_text(STAND_IN_TENSORRT)
    log = folder / "tensorrt.log"
    log.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(stand_in.parent), "STAND_IN_TENSORRT_LOG": str(log)}
    subprocess.run([sys.executable, str(folder / "build_engine.py"), *args], check=True, env=env, cwd="/")
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_engine_builder_asks_tensorrt_for_each_bucket_of_its_plan(tmp_path):
    """Without a GPU: build_engine.py driven against a stand-in tensorrt builds one engine per bucket, each from
    that bucket's ONNX file, at the requested precision and workspace, into the engine file its plan names."""
    _bundle(tmp_path, _buckets([64, 128]), FP16)
    plan = _plan(tmp_path)
    built = _build(tmp_path)
    workspace = plan["WORKSPACE_MIB"] << 20
    assert built == [
        {"onnx": b["onnx"], "flags": ["fp16"], "workspace": workspace, "profiles": []} for b in plan["BUCKETS"]
    ]  # static buckets: no optimisation profile
    for bucket in plan["BUCKETS"]:
        assert (tmp_path / bucket["engine"]).read_text() == f"placeholder engine from {bucket['onnx']}"
    last = plan["BUCKETS"][-1]
    again = _build(tmp_path, "--bucket", last["name"], "--precision", "int8", "--workspace-mib", "64")
    assert again == [{"onnx": last["onnx"], "flags": ["int8"], "workspace": 64 << 20, "profiles": []}]


def test_engine_builder_gives_a_dynamic_model_the_profile_spanning_the_buckets(tmp_path):
    manifest = _bundle(tmp_path, _buckets([64, 128]), FP16)
    dynamic = parse("""
<ir_version: 9, opset_import: ["" : 17]>
g (int64[1, seq] ids, float[1, 3, 8, 8] pixels) => (int64[1, seq] z, float[1, 3, 8, 8] y)
{ z = Identity (ids)
  y = Relu (pixels) }
""")
    onnx.save(dynamic, tmp_path / "dynamic.onnx")
    [built] = _build(tmp_path, "--dynamic", str(tmp_path / "dynamic.onnx"))
    ids = _span(manifest)["ids"]
    # Only the input with a symbolic dim gets a profile, spanning the buckets' shapes, opt the first bucket's.
    assert built["onnx"] == "dynamic.onnx" and built["profiles"] == [{"ids": [ids["min"], ids["opt"], ids["max"]]}]
    assert (tmp_path / "model.dynamic.plan").read_text() == "placeholder engine from dynamic.onnx"


def _why_no_tensorrt_engine() -> str | None:
    """Why a real TensorRT engine cannot be built on this machine, or None where it can."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt package is not installed"
    if not any(Path(device).exists() for device in ("/dev/nvidia0", "/dev/nvhost-ctrl-gpu", "/dev/nvgpu")):
        return "no NVIDIA GPU device on this machine"
    return None


NO_TENSORRT_ENGINE = _why_no_tensorrt_engine()


@pytest.mark.skipif(
    NO_TENSORRT_ENGINE is not None,
    reason=f"TensorRT builds engines only on an NVIDIA GPU, and CI has none ({NO_TENSORRT_ENGINE}): run this on "
    "a GPU machine with `pip install tensorrt`; the builder's plan and its calls are checked above without one",
)
def test_engine_builder_builds_a_real_engine_on_a_gpu(tmp_path):
    _bundle(tmp_path, _buckets([16]), {})
    subprocess.run([sys.executable, str(tmp_path / "build_engine.py")], check=True)
    engine = (tmp_path / "model.batch1_seq16.plan").read_bytes()
    assert len(engine) > 0 and not engine.startswith(b"placeholder")
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    assert runtime.deserialize_cuda_engine(engine) is not None  # a real engine this GPU loads


@pytest.mark.models
def test_vit_bundle_for_orin(tmp_path):
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(
        fixture("vit"), OptimizeOptions(shape_buckets={"batch": [1, 2]}, measure_latency=False)
    )
    report = result.report
    assert report["validation"]["ok"] is True
    assert (
        "layer_norm" in report["fusions"]["applied"]
    )  # LayerNormalization is in the matrix (opset 17 <= 20)
    manifest = json.loads(result.artifacts["manifest.json"])
    assert set(manifest["vendor_files"]) == {"trtexec.sh", "build_engine.py"}
    assert [b.name for b in result.buckets] == ["batch1", "batch2"], "expected one bucket per batch size"
    for bucket in result.buckets:
        assert all(
            report["partition"][bucket.name]["placement"][n.name] == "accelerator" for n in bucket.model.graph
        )
    script = tmp_path / "trtexec.sh"
    script.write_bytes(result.artifacts["trtexec.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "--maxShapes=pixel_values:2x3x32x32" in result.artifacts["trtexec.sh"].decode()
