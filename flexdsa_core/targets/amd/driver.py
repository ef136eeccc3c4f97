"""AMD Quark driver: quantise each bucket to QDQ ONNX, run it in ONNX Runtime on the CPU, return its outputs.

Runs inside the amd toolchain's own environment (never imported by the core)::

    python driver.py request.json result.json

Per bucket: the bucket's ``dataset`` (the core's calibration samples) is the calibration data, else its one
sample input plus ``options.dataset``; Quark's ``ModelQuantizer`` quantises the bucket's ONNX with the preset
the options name; the quantised model is written to ``out_dir/<bucket file>.qdq.onnx`` and run in ONNX
Runtime (CPU, with Quark's custom-op library for its BF16 Q/DQ) on the sample input and on the bucket's
``samples``, its outputs saved as .npy for the core to compare with the original model's.

``options`` (all optional):

* ``presets``: ``{"cnn": "XINT8", "transformer": "A8W8"}``, Quark's preset names (its
  ``custom_config.<NAME>_QCONFIG``); a graph with Softmax, LayerNormalization or a MatMul of two run-time
  tensors is a transformer. XINT8 is int8 symmetric with power-of-two scales (MinMSE), per tensor: what the
  Vitis AI DPU and the Ryzen AI NPU's CNN path take; A8W8 is int8 symmetric with float scales.
* ``ladder``: per model kind (``{"cnn": [...], "transformer": [...]}``), the steps tried in order until
  the quantised model's cosine to the float bucket on the samples reaches ``min_cosine`` (default 0.99): ``"preset"`` (the preset as is), ``"float_non_compute"`` (only
  Conv/ConvTranspose/Gemm/MatMul quantised, every other node left in float), ``"adaround"`` (the preset
  with Quark's AdaRound fast fine-tuning, ``adaround_iterations`` steps). The first step that reaches the
  target is kept, else the best one, and the result says which and why.
* ``dataset``: more calibration samples, each a list of .npy paths in graph-input order.
* ``keep_float``: ``{bucket: [node names]}`` left in float at every step (the nodes the partition puts on the
  CPU beside an int8-only accelerator, which the vendor compiler leaves to CPU subgraphs).
* ``precision``: ``"int8"`` (default: the preset and its ladder), ``"mixed"`` (the same, with
  ``float_layers``' ``{bucket: [node names]}`` also excluded at every step: the layers the core's sensitivity
  search keeps out of int8), or ``"bf16"`` (Quark's ``BF16`` config, no calibration ladder: what the Vitis AI EP
  makes of a float model on the NPU). ``why``: a sentence the result repeats (why this precision ran).

Quark decides no placement (the Vitis AI EP partitions at session creation on the device, vai_c_xir at
compile time), so ``placement`` stays empty and the notes say so.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

# Run as a script in the vendor environment, where flexdsa_core is not installed: what every driver shares is
# imported by plain name from the toolchains' common folder (a folder of its own, so nothing else is shadowed).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "toolchains" / "drivers"))
import _driver_common as common  # noqa: E402

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
TRANSFORMER_OPS = frozenset({"Softmax", "LayerNormalization"})
DEFAULT_PRESETS = {"cnn": "XINT8", "transformer": "A8W8"}
DEFAULT_LADDER = {"cnn": ("preset",), "transformer": ("preset", "float_non_compute")}
DEFAULT_MIN_COSINE = 0.99
DEFAULT_ADAROUND_ITERATIONS = 100
PACKAGES = ("amd-quark", "onnx", "onnxruntime", "numpy", "torch")  # versions in result.json
# After ok/versions/buckets/error in result.json: what the core says it did with the bucket.
EXTRA = {"verb": "quantised with Quark", "runner": "ONNX Runtime (CPU, quantised model)"}


def main(request_path: str, result_path: str) -> int:
    return common.run_request(request_path, result_path, quantize_bucket, PACKAGES, EXTRA)


def quantize_bucket(bucket: dict, out_dir: Path, options: dict) -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort

    name = bucket["name"]
    source = bucket["onnx"]
    artifact = Path(source).name.removesuffix(".onnx") + ".qdq.onnx"
    entry: dict = {"name": name, "artifacts": [], "placement": {}, "outputs": {}}
    model = onnx.load(source)
    feeds = {key: np.load(path) for key, path in bucket.get("inputs", {}).items()}
    input_names = [i.name for i in ort.InferenceSession(source, providers=["CPUExecutionProvider"]).get_inputs()]
    samples = common.load_samples(bucket.get("dataset"), input_names)
    if not samples:
        samples = ([feeds] if feeds else []) + common.load_samples(options.get("dataset"), input_names)
    if not samples:
        entry["error"] = "no sample inputs to calibrate on (give the bucket's inputs or options.dataset)"
        return entry
    checks = common.load_samples(bucket.get("samples"), input_names) or ([feeds] if feeds else [])

    precision = options.get("precision", "int8")
    kind = "transformer" if is_transformer(model.graph) else "cnn"
    preset = "BF16" if precision == "bf16" else {**DEFAULT_PRESETS, **(options.get("presets") or {})}[kind]
    min_cosine = float(options.get("min_cosine", DEFAULT_MIN_COSINE))
    reference = [_run(source, sample) for sample in checks] if checks else None
    names = {n.name for n in model.graph.node}
    keep_float = sorted(names & set((options.get("keep_float") or {}).get(name, [])))
    float_layers = sorted(names & set((options.get("float_layers") or {}).get(name, []))) if precision == "mixed" else []
    ladder = ("preset",) if precision == "bf16" else {**DEFAULT_LADDER, **(options.get("ladder") or {})}[kind]
    started = time.perf_counter()
    tried: list[dict] = []
    best: tuple[float, Path, dict] | None = None
    with common.captured("quark-") as log_path:
        for step in ladder:
            candidate = out_dir / f"{name}.{step}.qdq.onnx"
            excluded = set(keep_float) | set(float_layers)
            if step == "float_non_compute":
                excluded |= {n.name for n in model.graph.node if n.op_type not in COMPUTE_OPS}
            attempt = {"step": step, "preset": preset, "float_nodes": len(excluded)}
            try:
                quantize(source, candidate, preset, samples, step, sorted(excluded), options)
            except Exception as err:  # Quark raises on graphs it cannot handle; the next step may work
                attempt["error"] = f"{type(err).__name__}: {err}"
                tried.append(attempt)
                continue
            cosine = (
                _min_cosine_all(reference, [_run(str(candidate), sample) for sample in checks])
                if reference is not None else None
            )  # fmt: skip
            attempt["cosine_on_samples"] = cosine
            tried.append(attempt)
            score = cosine if cosine is not None else 1.0
            if best is None or score > best[0]:
                best = (score, candidate, attempt)
            if score >= min_cosine:
                break
    entry["seconds"] = round(time.perf_counter() - started, 3)
    entry["log"] = Path(log_path).read_text(errors="replace")[-200_000:]
    if best is None:
        entry["error"] = "Quark could not quantise the model: " + "; ".join(
            f"{a['step']}: {a.get('error')}" for a in tried
        )
        return entry
    score, chosen, attempt = best
    chosen.replace(out_dir / artifact)
    for other in out_dir.glob(f"{name}.*.qdq.onnx"):
        other.unlink()
    entry["artifacts"].append(artifact)
    if feeds:
        common.save_outputs(entry, out_dir, name, _run(str(out_dir / artifact), feeds).items())
    entry["sample_outputs"] = []
    for index, sample in enumerate(common.load_samples(bucket.get("samples"), input_names)):
        saved = {"outputs": {}}
        common.save_outputs(saved, out_dir, f"{name}.sample{index:03d}", _run(str(out_dir / artifact), sample).items())
        entry["sample_outputs"].append(saved["outputs"])
    quantized = onnx.load(str(out_dir / artifact))
    entry["quantization"] = {
        "preset": preset,
        "model_kind": kind,
        "step": attempt["step"],
        "calibration_samples": len(samples),
        "min_cosine": min_cosine,
        "reached": score >= min_cosine,
        "tried": tried,
        "qdq_pairs": sum(1 for n in quantized.graph.node if n.op_type == "QuantizeLinear"),
        "float_nodes": attempt["float_nodes"],
        "kept_float_for_cpu": len(keep_float),
        "precision": precision,
        "kept_float_by_sensitivity": float_layers,
    }
    entry["notes"] = [options["why"]] if options.get("why") else []
    entry["notes"] += [
        f"Quark {preset} ({kind}) on {len(samples)} calibration sample(s), step {attempt['step']!r}: "
        + (f"cosine {score:.5f} to the float bucket on the samples" if reference is not None else "no check"),
        "Quark quantises but places no nodes: the Vitis AI EP partitions at session creation on the device "
        "(vai_c_xir at compile time for the DPU), so the vendor placement is not available here",
    ]
    if float_layers:
        entry["notes"].append(
            f"{len(float_layers)} layer(s) kept in float as the sensitivity search asked (precision mixed): "
            + ", ".join(float_layers[:8])
        )
    if keep_float:
        entry["notes"].append(
            f"{len(keep_float)} node(s) the partition puts on the CPU left in float (CPU subgraphs)"
        )
    if attempt["float_nodes"] > len(set(keep_float) | set(float_layers)):
        entry["notes"].append(
            f"{attempt['float_nodes'] - len(set(keep_float) | set(float_layers))} more node(s) other than Conv/Gemm/MatMul left in float "
            "to reach the accuracy target; on an int8-only accelerator they run on the CPU"
        )
    return entry


def is_transformer(graph) -> bool:
    """Softmax/LayerNormalization, or a MatMul of two run-time tensors (attention scores)."""
    constants = {init.name for init in graph.initializer}
    constants |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    for node in graph.node:
        if node.op_type in TRANSFORMER_OPS:
            return True
        if node.op_type == "MatMul" and all(i not in constants for i in node.input[:2]):
            return True
    return False


def quantize(source: str, output: Path, preset: str, samples: list[dict], step: str, excluded: list[str],
             options: dict) -> None:  # fmt: skip
    from onnxruntime.quantization.calibrate import CalibrationDataReader
    from quark.onnx import AdaRoundConfig, ModelQuantizer
    from quark.onnx.quantization.config import custom_config

    preset_config = getattr(custom_config, f"{preset}_QCONFIG", None)
    if preset_config is None:
        raise ValueError(f"Quark has no preset {preset!r} (custom_config.{preset}_QCONFIG)")
    config = copy.deepcopy(preset_config)
    config.exclude = list(excluded)
    if step == "adaround":
        iterations = int(options.get("adaround_iterations", DEFAULT_ADAROUND_ITERATIONS))
        config.algo_config = [*config.algo_config, AdaRoundConfig(num_iterations=iterations, learning_rate=0.1)]

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.pending = iter(samples)

        def get_next(self):
            return next(self.pending, None)

        def rewind(self):
            self.pending = iter(samples)

    ModelQuantizer(config).quantize_model(source, str(output), Samples())
    if not output.is_file():
        raise RuntimeError("Quark wrote no model (see the log)")


def _run(path: str, feeds: dict) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    try:  # Quark's BF16 (and other extended) Q/DQ ops live in its custom-op library
        from quark.onnx import get_library_path

        options.register_custom_ops_library(get_library_path())
    except Exception:  # noqa: BLE001 - plain int8 QDQ runs without it
        pass
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _min_cosine_all(reference: list[dict], got: list[dict]) -> float:
    """Per output, the cosine over every sample at once (as the core's accuracy target judges); the worst."""
    import numpy as np

    joined_want = {k: np.concatenate([r[k].ravel() for r in reference]) for k in reference[0]}
    joined_got = {k: np.concatenate([g[k].ravel() for g in got]) for k in reference[0]}
    return _min_cosine(joined_want, joined_got)


def _min_cosine(reference: dict, got: dict) -> float:
    import numpy as np

    worst = 1.0
    for name, want in reference.items():
        a = want.astype(np.float64).ravel()
        b = got[name].astype(np.float64).ravel()
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        worst = min(worst, float(a @ b / norm) if norm else (1.0 if np.allclose(a, b) else 0.0))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
