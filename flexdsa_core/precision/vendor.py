"""Vendor int8 formats: the layers an accelerator's own quantiser should keep float, and its verdict.

``_vendor`` ranks layers with the ONNX Runtime QDQ that stands in for the vendor's quantiser (its
``Int8Format``) and writes the float layers the vendor's hybrid quantisation is fed; ``vendor_verdict``
takes the vendor toolchain's own accuracy on held-out samples, where it ran, as the last word.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from flexdsa_core.accuracy import describe as _describe
from flexdsa_core.errors import ValidationFailedError
from flexdsa_core.precision.formats import int8_format
from flexdsa_core.precision.mixed import _layer_table, _mixed, _sensitivity
from flexdsa_core.precision.quantise import _quantize_static, _weight_layers
from flexdsa_core.precision.scoring import PrecisionRun, _Candidate, _save, sensitivity_order
from flexdsa_core.targets.int8_format import Int8Format


def _vendor(run: PrecisionRun, report: dict, fmt: Int8Format | None) -> None:
    """int8/mixed on a target whose toolchain quantises: the bucket ships in fp32 with our calibration samples
    for the vendor's quantiser. For ``mixed``, layers are ranked and the fewest float ones found here, on the
    stand-in QDQ (``fmt``), and handed to the toolchain as ``float_layers`` (QNN: uint16 activations; RKNN: its
    hybrid quantisation; Quark: excluded). The vendor's result is judged afterwards (``vendor_verdict``)."""
    report["shipped"] = "fp32"
    report["vendor_quantiser"] = True
    if fmt is not None:
        report["format"] = fmt.as_dict()
    report["note"] = (
        f"{run.options.precision} on {run.target.name} is the vendor toolchain's own quantisation: the model "
        "ships in fp32 with the calibration samples for it (calibration.npz; dataset.txt listing one .npy per "
        "input a line under calibration/), the toolchain calibrates on exactly these samples where it installs, "
        "and the bundle's scripts ask the vendor step for it"
    )
    if run.options.precision != "mixed" or fmt is None:
        return
    fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
    reference = run.reference()
    cache = run.workdir / "calibration_ranges.json"
    full = _quantize_static(fp32, run.workdir / "stand_in.onnx", run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method)
    layers = _weight_layers(onnx.load(str(full)))
    full_score = run.score_judged(full)
    full_score["measured_on"] = run.measured_on()
    report["stand_in_all_int8"] = full_score
    if not layers:
        report["float_layers"] = []
        return
    # The stand-in search ranks every layer with int8 weights (its weight-scope tier quantises exactly those):
    # what the vendor keeps out of int8 is this list. No per-op timing: the part is not this machine.
    stand_in = _Candidate("stand_in", full, "stand-in QDQ of every op", accuracy=full_score)
    candidate, sensitivity, reasons, search = _mixed(run, fp32, layers, reference, cache, fmt, stand_in, frozenset())
    int8_nodes = frozenset() if candidate.error else candidate.int8_nodes
    table = _layer_table(
        frozenset(n for n, _ in layers) if int8_nodes is None else int8_nodes, layers, {}, sensitivity, reasons,
        "not quantised in the stand-in model",
    )  # fmt: skip
    for row in table:
        row["on_target"] = fmt.float_as if row["precision"] == "float32" else "int8"
    report["layers"] = table
    report["search"] = search
    report["stand_in_mixed"] = {"note": candidate.error} if candidate.error else candidate.accuracy
    report["float_layers"] = [row["layer"] for row in table if row["precision"] == "float32"]
    report["float_layer_tensors"] = _layer_tensors(run.fp32_model, report["float_layers"])


def _layer_tensors(model: ir.Model, layers: list[str]) -> dict[str, list[str]]:
    """Per layer (node name), its first run-time input and its first output: the ends of the one-node subgraph
    a vendor tool keeps in float (rknn-toolkit2's ``custom_hybrid`` takes ``[input, output]`` pairs)."""
    wanted, found = set(layers), {}
    for node in model.graph:
        if node.name not in wanted:
            continue
        data = next(
            (v for v in node.inputs if v is not None and v.const_value is None and not v.is_initializer()), None
        )
        if data is not None and node.outputs:
            found[node.name] = [data.name, node.outputs[0].name]
    return found


def vendor_verdict(run: PrecisionRun, section: dict, bucket: str, accuracy: dict | None, ran: bool) -> bool:
    """The vendor toolchain's quantised bucket judged by the accuracy target (``accuracy``: ``score`` of its
    simulator/emulator outputs on the held-out samples, which its quantiser did not calibrate on). Returns whether its artifacts may ship. A miss
    fails the job naming the most sensitive layers, or, with ``precision_fallback: "fp32"`` (and always for
    ``mixed``, whose float end is fp32), ships the float bundle without them, with a warning."""
    if not ran or accuracy is None:
        section["warnings"].append(
            f"[{bucket}] the vendor toolchain did not run here, so the {run.options.precision} model it makes was "
            "not checked against the accuracy target: the bundle ships fp32 with the samples for its quantiser"
        )
        return True
    if accuracy.get("ok"):
        return True
    missed = _describe(accuracy, run.options.accuracy)
    ranked = section.get("layers")
    if not ranked:
        fmt = int8_format(run.target)
        fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
        reference = run.reference()
        cache = run.workdir / "calibration_ranges.json"
        full = _quantize_static(fp32, run.workdir / "stand_in.onnx", run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method)
        sensitivity = _sensitivity(run, fp32, _weight_layers(onnx.load(str(full))), reference, cache, fmt)
        ranked = [{"layer": n, "sensitivity": s["loss"], "alone": s["outputs"]}
                  for n, s in sorted(sensitivity.items(), key=lambda item: sensitivity_order(item[1]))[:5]]  # fmt: skip
        section["layers"] = ranked
    worst = sorted(ranked, key=lambda row: -row["sensitivity"])[:5]
    names = ", ".join(f"{row['layer']} (loss {row['sensitivity']:.4f})" for row in worst) or "none found"
    message = (
        f"[{bucket}] the vendor toolchain's {run.options.precision} model misses the accuracy target on "
        f"{accuracy.get('measured_on') or 'its samples'} ({missed}); most sensitive layers (ranked on the stand-in QDQ): "
        f"{names}"
    )
    if run.options.precision == "mixed" or run.options.precision_fallback == "fp32":
        section["warnings"].append(f"{message}; its quantised artifacts were left out and the bundle ships fp32")
        section.setdefault("dropped_buckets", []).append(bucket)
        return False
    raise ValidationFailedError(
        f"{message}. Use precision 'mixed' to keep the sensitive layers out of int8, relax 'accuracy', or set "
        "precision_fallback 'fp32'.",
        details={"precision": section},
    )
