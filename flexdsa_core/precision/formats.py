"""What a precision request may ask of a target, and the int8 format each target takes.

``check_precision_request`` and ``check_calibration_source`` refuse, before any work, what a target cannot
compute or what would make an accuracy claim without samples; ``int8_format`` names the QDQ form (activation
and weight types, symmetry, granularity, ``targets.int8_format.Int8Format``): the one that stands in for a
vendor's quantiser, which its adapter declares (``PlatformAdapter.int8_format``), or ONNX Runtime's own x86 form
on cpu-ort (``cpu_int8_features``: 7-bit weights without an int8 dot-product instruction).
"""

from __future__ import annotations

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.kernel_timing import machine_fingerprint
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.targets import get_adapter
from flexdsa_core.targets.int8_format import Int8Format

# Flags that give the int8 GEMM a dot-product instruction without 16-bit intermediate sums.
_INT8_DOT_FLAGS = ("avx512_vnni", "avx512vnni", "avx_vnni", "amx_int8", "asimddp", "dotprod", "i8mm")


def cpu_int8_features() -> dict:
    """This CPU's vector flags as ONNX Runtime's kernels see them, and the int8 format chosen for it."""
    fingerprint = machine_fingerprint()
    flags = fingerprint.rsplit("isa=", 1)[-1].split(",")
    dot = [flag for flag in _INT8_DOT_FLAGS if flag in flags]
    x86 = any(flag.startswith(("avx", "sse")) for flag in flags)
    return {
        "flags": flags,
        "int8_dot_product": dot,
        "activations": "uint8",
        "weights": "int8, per channel",
        "reduce_range": bool(x86 and not dot),
        "why": (
            f"{', '.join(dot)}: full 8-bit weights"
            if dot
            else "no VNNI/AMX: u8 x s8 products are summed in 16 bits and can saturate, so weights use 7 bits "
            "(reduce_range)"
        ),
    }


def check_precision_request(options: OptimizeOptions, target, buckets: int | None = None) -> None:
    """Refuse, before any work, a precision this target cannot compute (its ``dtypes``, from the sourced facts):
    fp16 on cpu-ort (float16 through casts), on the KV260 DPU (int8 only) or on the XDNA 2 NPU (bfloat16, not
    float16); int8/mixed where the part has no int8. Every shape bucket gets the precision (``buckets`` is
    accepted for callers that pass it)."""
    if options.precision == "fp32":
        return
    calibrated = bool(getattr(target, "calibrated", False))
    if options.precision == "fp16" and calibrated:
        raise InvalidOptionsError(
            "precision 'fp16' is for accelerator targets: ONNX Runtime's CPU kernels compute float16 through "
            "casts and would be slower than fp32. Use 'int8' or 'mixed' on cpu-ort.",
            details={"precision": "fp16", "target": target.name},
        )
    dtypes = list(getattr(target, "dtypes", None) or [])
    wanted = "float16" if options.precision == "fp16" else "int8"
    if calibrated or not dtypes or wanted in dtypes:
        return
    floats = [d for d in dtypes if d in ("bfloat16", "float32")]
    notes = getattr(target, "quantization", None) or {}
    if wanted == "float16" and "bfloat16" in floats:
        advice = (
            f"its half-precision type is bfloat16 ({notes.get('bfloat16', 'no float16 on the part')}): use "
            "precision 'fp32' for that, or 'int8'/'mixed'"
        )
    elif wanted == "float16":
        advice = "use precision 'int8' or 'mixed' (quantised with the target's own scheme)"
    else:
        advice = "use precision 'fp32' or 'fp16'"
    raise InvalidOptionsError(
        f"unsupported dtype on target: {target.name} computes {', '.join(dtypes)}, not {wanted} "
        f"(precision {options.precision!r}); {advice}.",
        details={"precision": options.precision, "target": target.name, "target_dtypes": dtypes},
    )


def int8_only(target) -> bool:
    """The part computes int8 and nothing else (the KV260's DPU): every model it runs is quantised."""
    dtypes = list(getattr(target, "dtypes", None) or [])
    return bool(dtypes) and all(dtype in ("int8", "uint8", "int4") for dtype in dtypes)


def check_calibration_source(options: OptimizeOptions, target, has_samples: bool) -> None:
    """Refuse, before any work, an int8-only target without calibration samples: it would quantise the model
    on synthetic inputs and claim an accuracy it never measured. ``allow_synthetic_calibration`` lets it
    through (with a warning, ``synthetic_calibration_warning``)."""
    if has_samples or options.allow_synthetic_calibration or not int8_only(target):
        return
    raise InvalidOptionsError(
        f"{target.name} computes int8 only, so every model is quantised for it, and quantising needs calibration "
        "samples of your data: send them as the 'calibration' file (on the command line --calibration samples.npz: "
        "one array per model input, named as the input, samples stacked on the first axis) with precision 'int8' "
        "or 'mixed'. To quantise on seeded random inputs instead (numerics only, no accuracy claim), set "
        "allow_synthetic_calibration: true (--allow-synthetic-calibration; the dashboard's synthetic-calibration box).",
        details={"target": target.name, "target_dtypes": list(target.dtypes), "fix": "calibration samples"},
    )


def synthetic_calibration_warning(target) -> str:
    return (
        f"{target.name} computes int8 only and no calibration samples were given (allow_synthetic_calibration): "
        "the model was quantised on seeded random inputs, which check numerics only and make no accuracy claim. "
        "Send samples of your data (the 'calibration' .npz) for an accuracy check on them"
    )


def int8_format(target) -> Int8Format | None:
    """The target's int8 format: on a calibrated target (cpu-ort) this machine's ONNX Runtime form; elsewhere the
    one its adapter declares (for a vendor-quantised target, the stand-in QDQ with ``vendor`` set), None for a
    target nobody here knows how to quantise for."""
    if getattr(target, "calibrated", False):  # cpu-ort: ONNX Runtime's x86/ARM kernels, u8 activations
        return Int8Format("onnxruntime u8s8 QDQ", "uint8", False, cpu_int8_features()["reduce_range"], True)
    return get_adapter(target).int8_format
