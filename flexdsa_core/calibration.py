"""Calibration samples: an ``.npz`` of named inputs, checked against the model before any work.

Layout: one array per graph input, named as the input. The first axis holds the samples: on an input
whose first dim is symbolic (``batch``) each row is one sample of batch 1; on a fixed first dim ``b`` the
axis is cut into runs of ``b`` rows. Every other fixed dim must match; a symbolic dim may take any value
but the same for every input that names it (``seq`` of ``input_ids`` and of ``attention_mask``). dtypes
must be the inputs' own (no silent casts: a float64 array for a float32 input is refused with the fix).
Integer inputs that index an embedding table must lie inside it.

Without uploaded samples, ``synthetic_samples`` draws seeded random ones (``validate.make_inputs``); the
report then warns that accuracy was judged on them.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import onnx

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.validate import _gather_vocab_sizes, make_inputs

__all__ = ["CalibrationError", "check_calibration", "load_calibration", "synthetic_samples"]

# More samples add calibration time, not much accuracy: the rest of the upload is left unused (reported).
MAX_SAMPLES = 256
SYNTHETIC_SAMPLES = 16
# Arrays unpacked from one .npz, in all.
MAX_CALIBRATION_BYTES = 1 << 30


class CalibrationError(InvalidOptionsError):
    """Calibration data that cannot be read, or does not fit the model's inputs."""

    code = "invalid_calibration"


def load_calibration(source: bytes | str | Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (no pickled objects: an upload never runs code)."""
    how = "Save it with numpy.savez('samples.npz', input_name=array, ...), one array per model input."
    try:
        handle = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115
        with handle:
            if handle.read(4) != b"PK\x03\x04":  # an .npz is a zip archive of .npy files
                raise CalibrationError(f"calibration data is not an .npz file (a zip of .npy arrays). {how}")
            handle.seek(0)
            # A small compressed upload can unpack to gigabytes: judge the sizes it declares first.
            unpacked = sum(member.file_size for member in zipfile.ZipFile(handle).infolist())
            if unpacked > MAX_CALIBRATION_BYTES:
                raise CalibrationError(
                    f"calibration .npz unpacks to {unpacked / 2**20:.0f} MiB, more than the "
                    f"{MAX_CALIBRATION_BYTES / 2**20:.0f} MiB accepted: send fewer samples (at most {MAX_SAMPLES} "
                    "are used)."
                )
            handle.seek(0)
            with np.load(handle, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
    except ValueError as err:
        if "pickle" in str(err):
            raise CalibrationError(
                f"calibration .npz holds Python objects, which are refused (loading them could run code). {how}"
            ) from None
        raise CalibrationError(f"calibration .npz cannot be read ({err}). {how}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise CalibrationError(f"calibration .npz cannot be read ({err}). {how}") from None
    if not arrays:
        raise CalibrationError("calibration .npz holds no arrays: give one array per model input, named as it.")
    return arrays


def _input_specs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, list[int | str]]]:
    initializers = {init.name for init in model.graph.initializer}
    specs = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
        specs[value.name] = (np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims)
    return specs


def check_calibration(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The samples as feeds (one dict per ONNX Runtime run), or a ``CalibrationError`` saying what does not
    fit and how to fix it. ``model`` may be loaded without weights (shapes of Gather tables suffice)."""
    specs = _input_specs(model)
    missing, extra = sorted(set(specs) - set(arrays)), sorted(set(arrays) - set(specs))
    if missing or extra:
        raise CalibrationError(
            "calibration data does not name the model's inputs: "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(map(repr, missing))}" if missing else "",
                    f"not inputs of the model {', '.join(map(repr, extra))}" if extra else "",
                )
                if part
            )
            + f". The model's inputs are: {', '.join(f'{n} {d} {s}' for n, (d, s) in specs.items())}.",
            details={"missing": missing, "unexpected": extra},
        )
    problems: list[str] = []
    named_dims: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = {}
    for name, (dtype, dims) in specs.items():
        array = arrays[name]
        if array.dtype != dtype:
            problems.append(
                f"{name!r} is {array.dtype}, the model takes {dtype} (convert with .astype(numpy.{dtype}))"
            )
            continue
        if array.ndim != len(dims):
            problems.append(
                f"{name!r} has shape {list(array.shape)} (rank {array.ndim}), the model takes rank {len(dims)} "
                f"{dims}; stack the samples along the first axis"
            )
            continue
        for axis, (want, got) in enumerate(zip(dims, array.shape, strict=True)):
            if axis == 0:
                if isinstance(want, int) and want > 0:
                    if got % want:
                        problems.append(f"{name!r} has {got} rows, not a multiple of the model's batch {want}")
                    counts[name] = got // want
                else:
                    counts[name] = got
                continue
            if isinstance(want, int) and want > 0 and got != want:
                problems.append(f"{name!r} dim {axis} is {got}, the model fixes it to {want}")
            elif isinstance(want, str) and want != "?":
                seen = named_dims.setdefault(want, (got, name))
                if seen[0] != got:
                    problems.append(f"dim {want!r} is {got} in {name!r} but {seen[0]} in {seen[1]!r}")
    if not problems and len(set(counts.values())) > 1:
        problems.append(f"inputs hold different numbers of samples: {counts}")
    if not problems and min(counts.values(), default=0) == 0:
        problems.append("no samples (the first axis is empty)")
    if not problems:
        for name, size in _gather_vocab_sizes(model).items():
            array = arrays.get(name)
            if array is not None and array.size and (array.min() < 0 or array.max() >= size):
                problems.append(
                    f"{name!r} holds ids {int(array.min())}..{int(array.max())}, outside the model's table of "
                    f"{size} rows"
                )
    if problems:
        raise CalibrationError(
            "calibration data does not fit the model: " + "; ".join(problems) + ".",
            details={"problems": problems},
        )
    samples = min(next(iter(counts.values())), MAX_SAMPLES)
    feeds = []
    for index in range(samples):
        feed = {}
        for name, (_, dims) in specs.items():
            step = dims[0] if isinstance(dims[0], int) and dims[0] > 0 else 1
            feed[name] = np.ascontiguousarray(arrays[name][index * step : (index + 1) * step])
        feeds.append(feed)
    return feeds


def synthetic_samples(model: onnx.ModelProto, *, seed: int, count: int = SYNTHETIC_SAMPLES) -> list[dict]:
    """Seeded random samples of batch 1 (token ids inside the embedding table, masks of ones)."""
    return [make_inputs(model, seed=seed + index, dims={"batch": 1}) for index in range(count)]
