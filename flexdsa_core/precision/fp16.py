"""float16 on accelerators: ONNX Runtime's float16 converter, judged element-wise and by the accuracy target.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.accuracy import describe as _describe
from flexdsa_core.accuracy import score
from flexdsa_core.errors import ValidationFailedError
from flexdsa_core.ort_runs import DEFAULT_TOLERANCES
from flexdsa_core.precision.scoring import PrecisionRun, _outputs, _save, claim


def _fp16(run: PrecisionRun, report: dict) -> ir.Model:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = ir.to_proto(run.fp32_model)
    converted = convert_float_to_float16(proto, keep_io_types=run.options.keep_io_types, disable_shape_infer=True)
    path = _save(converted, run.workdir / "fp16.onnx")
    reference = run.reference()
    try:
        got = _outputs(path, run.judged, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    except Exception as err:  # noqa: BLE001 - ONNX Runtime's words are the reason
        raise ValidationFailedError(
            f"the float16 model cannot run in ONNX Runtime for validation: {str(err).splitlines()[0][:300]}. "
            "Use precision 'fp32' for this model.",
        ) from None
    atol, rtol = DEFAULT_TOLERANCES["float16"]
    if run.options.tolerances and "float16" in run.options.tolerances:
        atol, rtol = run.options.tolerances["float16"].atol, run.options.tolerances["float16"].rtol
    accuracy = score(reference, [{k: v.astype(np.float32) for k, v in s.items()} for s in got], run.options.accuracy,
                     labels=run.judged_labels, groups=run.judged_groups, cosine_by_bound=run.claims)  # fmt: skip
    worst_abs = 0.0
    elementwise_ok = True
    for want_sample, got_sample in zip(reference, got, strict=True):
        for name, want in want_sample.items():
            if not np.issubdtype(want.dtype, np.floating):
                continue
            have = got_sample[name].astype(np.float64)
            scale = float(np.abs(want).max()) or 1.0  # float16 keeps ~3 digits of the output's own range
            diff = np.abs(have - want)
            worst_abs = max(worst_abs, float(diff.max()) if diff.size else 0.0)
            elementwise_ok &= bool(np.all(diff <= atol * scale + rtol * np.abs(want)))
    accuracy["elementwise"] = {"atol": atol, "rtol": rtol, "relative_to": "each output's largest magnitude",
                               "max_abs": worst_abs, "ok": elementwise_ok}  # fmt: skip
    accuracy["measured_on"] = f"all {len(run.judged)} samples (float16 calibrates on none)"
    report["accuracy"] = accuracy
    report["keep_io_types"] = run.options.keep_io_types
    if not (accuracy["ok"] and elementwise_ok):
        raise ValidationFailedError(
            f"the float16 model misses the accuracy target: {_describe(accuracy, run.options.accuracy)}"
            + ("" if elementwise_ok else f"; max abs error {worst_abs:.3g} beyond float16 tolerance")
            + ". Use precision 'fp32', or relax 'accuracy'/'tolerances'.",
            details={"precision": report},
        )
    report["shipped"] = "fp16"
    report["claim"], warnings = claim(run, accuracy)
    report["warnings"].extend(warnings)
    return ir.from_proto(onnx.load(str(path)))
