"""The precision stage's entry: ``apply_precision`` dispatches by the requested precision and target, and
the helpers the optimizer uses to hand the chosen model and the samples on (``replace_model``,
``samples_npz``, ``samples_dataset``).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import time

import numpy as np
import onnx_ir as ir

from flexdsa_core.accuracy import labelled_output, metrics_for
from flexdsa_core.holdout import Fold, SplitPlan, plan
from flexdsa_core.precision.formats import int8_format
from flexdsa_core.precision.fp16 import _fp16
from flexdsa_core.precision.int8 import _int8
from flexdsa_core.precision.scoring import PrecisionRun
from flexdsa_core.precision.vendor import _vendor


def apply_precision(run: PrecisionRun) -> tuple[ir.Model | None, dict]:
    """The lower-precision model to ship (None: keep fp32) and the report's ``precision`` section."""
    report: dict = {
        "requested": run.options.precision,
        "accuracy_target": run.options.accuracy.model_dump(),
        "calibration": {
            "source": "synthetic" if run.synthetic else "uploaded",
            "samples": len(run.samples),
            "input_shapes": {k: list(v.shape) for k, v in run.samples[0].items()} if run.samples else {},
        },
        "warnings": [],
    }
    if run.labels is not None:
        report["calibration"]["labelled_rows"] = int(sum((labels >= 0).sum() for labels in run.labels))
    if run.groups is not None:
        report["calibration"]["groups"] = len(set(run.groups))
    if run.options.precision == "fp16":  # nothing calibrates: every sample judges
        run.split = SplitPlan("none", len(run.samples), (Fold((), tuple(range(len(run.samples)))),), "as_given")
        run.use_fold(0)
        report["judgement"] = {"mode": "no calibration (float16)", "judged_on": len(run.samples)}
    else:
        run.split = plan(len(run.samples), run.options.holdout, run.options.seed, groups=run.groups)
        run.use_fold(0)
        report["judgement"] = run.split.as_dict()
        report["warnings"].extend(_group_warnings(run))
    if run.labels is not None:  # which output they label, refused before any work where that is ambiguous
        report["calibration"]["labels_output"] = labelled_output(
            metrics_for(run.reference()[0], run.options.accuracy), run.options.accuracy
        )
    report["judgement"]["claim"] = (
        "numerics only: synthetic random inputs check that the lower-precision model computes what the original "
        "does on them; they make no accuracy claim (upload samples of your data for one)"
        if run.synthetic
        else "accuracy on your samples, decided on the ones held out from calibration"
    )
    if run.synthetic:
        report["warnings"].append(
            f"the {run.options.precision} model was checked on {len(run.samples)} synthetic random inputs, not on "
            "your data: numerics only, no accuracy claim. Upload calibration samples (an .npz of named inputs) "
            "for a real check"
        )
    elif run.split.mode == "none":
        report["warnings"].append(
            "one calibration sample: nothing could be held out, so the accuracy figures are on the sample the "
            f"quantiser calibrated on. Upload at least {run.options.holdout.folds_below} samples for a held-out check"
        )
    started = time.perf_counter()
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    if run.options.precision == "fp16":
        model = _fp16(run, report)
    else:
        fmt = int8_format(run.target)
        if fmt is None or fmt.vendor:
            model = None
            _vendor(run, report, fmt)
        else:
            model = _int8(run, report)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if not math.isfinite(report["seconds"]):
        report["seconds"] = None
    return model, report


def _group_warnings(run: PrecisionRun) -> list[str]:
    """Groups named that could not be held out whole."""
    if run.groups is None or run.split.mode == "none":
        return []
    if not run.options.holdout.by_groups:
        return [f"the samples name {len(set(run.groups))} groups but holdout.by_groups is false: samples of one "
                "group were split between calibrating and judging, so the figure is not on unseen sources"]  # fmt: skip
    if run.split.group_of is None:
        return ["every sample names the same group: nothing from another source could be held out, so samples of "
                "that one group were split; send samples from several sources for a figure that holds on new ones"]  # fmt: skip
    return []


def replace_model(bucket, model: ir.Model):
    """The bucket with its model replaced (the portable fp32 variant does not describe it any more)."""
    return dataclasses.replace(bucket, model=model, portable=None)


def samples_npz(samples: list[dict]) -> bytes:
    """The calibration samples as one ``.npz`` (rows stacked on the first axis), for a vendor's quantiser."""

    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.concatenate([s[name] for s in samples]) for name in samples[0]})
    return buffer.getvalue()


def samples_dataset(samples: list[dict], bucket: str | None = None) -> dict[str, bytes]:
    """The samples as ``calibration/NNN_<input>.npy`` files and ``dataset.txt`` listing one sample a line
    (its inputs' files, space-separated, in the model's input order): what RKNN-Toolkit2's
    ``build(do_quantization=True, dataset=...)`` and similar vendor quantisers read. With ``bucket`` (a model
    with several shape buckets, each calibrated at its own shapes): ``calibration/<bucket>/...`` and
    ``dataset.<bucket>.txt``."""

    folder = "calibration/" if bucket is None else f"calibration/{_safe_name(bucket)}/"
    files: dict[str, bytes] = {}
    lines = []
    for index, sample in enumerate(samples):
        names = []
        for name, array in sample.items():
            path = f"{folder}{index:03d}_{_safe_name(name)}.npy"
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            files[path] = buffer.getvalue()
            names.append(path)
        lines.append(" ".join(names))
    listing = "dataset.txt" if bucket is None else f"dataset.{_safe_name(bucket)}.txt"
    files[listing] = ("\n".join(lines) + "\n").encode()
    return files


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
