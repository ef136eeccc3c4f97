"""Calibration samples: an ``.npz`` of named inputs, checked against the model before any work.

Layout: one array per graph input, named as the input. The first axis holds the samples: on an input
whose first dim is symbolic (``batch``) each row is one sample of batch 1; on a fixed first dim ``b`` the
axis is cut into runs of ``b`` rows. Every other fixed dim must match; a symbolic dim may take any value
but the same for every input that names it (``seq`` of ``input_ids`` and of ``attention_mask``). dtypes
must be the inputs' own (no silent casts: a float64 array for a float32 input is refused with the fix).
Integer inputs that index an embedding table must lie inside it.

Two array names are reserved, unless the model has an input of that name (then it is that input): they
say something about the samples and are never fed to the model. Both are stacked on the first axis like the
inputs (one entry per row of the inputs' first axis):

* ``labels``: integer class indices of the top-1 output's rows (one per row of a ``[batch, classes]``
  output; ``[n, seq]`` for one per position); a negative value marks a row without a label. With labels, the
  accuracy target judges that output against them (``accuracy``, MLPerf's rule).
* ``groups``: the source of each sample (ints or strings: the photo eight crops came from, the speaker of a
  clip); the held-out samples are then whole groups (``holdout``). The rows of one sample share one group.

Without uploaded samples, ``synthetic_samples`` draws seeded random ones (``validate.make_inputs``); the
report then warns that accuracy was judged on them.
"""

from __future__ import annotations

import contextlib
import io
import math
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.ort_runs import _gather_vocab_sizes, make_inputs

__all__ = [
    "RESERVED", "CalibrationError", "CalibrationSamples", "check_calibration", "check_calibration_file",
    "load_calibration", "read_layouts", "synthetic_samples",
]  # fmt: skip

# Arrays that describe the samples instead of feeding the model (module docstring), unless the model has an
# input of that name.
RESERVED = ("labels", "groups")

# More samples add calibration time, not much accuracy: the rest of the upload is left unused (reported).
MAX_SAMPLES = 256
SYNTHETIC_SAMPLES = 16
# Arrays unpacked from one .npz, in all.
MAX_CALIBRATION_BYTES = 1 << 30


class CalibrationError(InvalidOptionsError):
    """Calibration data that cannot be read, or does not fit the model's inputs."""

    code = "invalid_calibration"


class CalibrationSamples(list):
    """The samples as feeds (one dict of inputs per ONNX Runtime run), with what the file said about them:
    ``labels`` (per sample, the class index of each of its rows, -1 where none; None: no labels) and
    ``groups`` (per sample, its source; None: not named)."""

    def __init__(self, feeds, labels: list[np.ndarray] | None = None, groups: list | None = None) -> None:
        super().__init__(feeds)
        self.labels = labels
        self.groups = groups


_HOW = "Save it with numpy.savez('samples.npz', input_name=array, ...), one array per model input."


def _open_archive(handle) -> zipfile.ZipFile:
    """The ``.npz`` as a zip, its declared sizes judged before anything is unpacked."""
    if handle.read(4) != b"PK\x03\x04":  # an .npz is a zip archive of .npy files
        raise CalibrationError(f"calibration data is not an .npz file (a zip of .npy arrays). {_HOW}")
    handle.seek(0)
    archive = zipfile.ZipFile(handle)
    # A small compressed upload can unpack to gigabytes: judge the sizes it declares first.
    unpacked = sum(member.file_size for member in archive.infolist())
    if unpacked > MAX_CALIBRATION_BYTES:
        raise CalibrationError(
            f"calibration .npz unpacks to {unpacked / 2**20:.0f} MiB, more than the "
            f"{MAX_CALIBRATION_BYTES / 2**20:.0f} MiB accepted: send fewer samples (at most {MAX_SAMPLES} "
            "are used)."
        )
    return archive


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    """The errors of reading an ``.npz`` as ``CalibrationError``s that say how to make a good one."""
    try:
        yield
    except ValueError as err:
        if "pickle" in str(err) or "object" in str(err):
            raise CalibrationError(
                f"calibration .npz holds Python objects, which are refused (loading them could run code). {_HOW}"
            ) from None
        raise CalibrationError(f"calibration .npz cannot be {what} ({err}). {_HOW}") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise CalibrationError(f"calibration .npz cannot be {what} ({err}). {_HOW}") from None


def _source(source: bytes | str | Path):
    return io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")  # noqa: SIM115


def load_calibration(source: bytes | str | Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file (no pickled objects: an upload never runs code)."""
    with _reading("read"), _source(source) as handle:
        _open_archive(handle)
        handle.seek(0)
        with np.load(handle, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    if not arrays:
        raise CalibrationError("calibration .npz holds no arrays: give one array per model input, named as it.")
    return arrays


def read_layouts(source: bytes | str | Path) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Each array of an ``.npz`` file as (dtype, shape), read from the ``.npy`` headers alone: nothing is
    unpacked beyond the first bytes of each member."""
    layouts = {}
    with _reading("read"), _source(source) as handle, _open_archive(handle) as archive:
        for member in archive.infolist():
            if not member.filename.endswith(".npy"):
                continue
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _fortran, dtype = read_header(stream)
            if dtype.hasobject:
                raise ValueError("object arrays need pickle")
            layouts[member.filename.removesuffix(".npy")] = (dtype, tuple(shape))
    if not layouts:
        raise CalibrationError("calibration .npz holds no arrays: give one array per model input, named as it.")
    return layouts


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


def _layout_problems(
    specs: dict[str, tuple[np.dtype, list[int | str]]], layouts: dict[str, tuple[np.dtype, tuple[int, ...]]]
) -> tuple[list[str], dict[str, int]]:
    """What does not fit in each input's dtype and shape (``layouts``: name -> (dtype, shape)), and the number
    of samples each input holds."""
    problems: list[str] = []
    named_dims: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = {}
    for name, (dtype, dims) in specs.items():
        got_dtype, shape = layouts[name]
        if got_dtype != dtype:
            problems.append(
                f"{name!r} is {got_dtype}, the model takes {dtype} (convert with .astype(numpy.{dtype}))"
            )
            continue
        if len(shape) != len(dims):
            problems.append(
                f"{name!r} has shape {list(shape)} (rank {len(shape)}), the model takes rank {len(dims)} "
                f"{dims}; stack the samples along the first axis"
            )
            continue
        for axis, (want, got) in enumerate(zip(dims, shape, strict=True)):
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
    return problems, counts


def _check_fit(
    model: onnx.ModelProto,
    specs: dict[str, tuple[np.dtype, list[int | str]]],
    layouts: dict[str, tuple[np.dtype, tuple[int, ...]]],
    values: Callable[[str], np.ndarray | None],
) -> dict[str, int]:
    """The number of samples per input, or a ``CalibrationError``: names, then dtypes and shapes (from
    ``layouts``), then the ids of inputs that index a table (``values(name)``: the array, or None to skip)."""
    reserved = _reserved(specs)
    missing, extra = sorted(set(specs) - set(layouts)), sorted(set(layouts) - set(specs) - reserved)
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
            + f". The model's inputs are: {', '.join(f'{n} {d} {s}' for n, (d, s) in specs.items())}"
            + (f" ({' and '.join(map(repr, sorted(reserved)))} may describe the samples as well)." if reserved else "."),
            details={"missing": missing, "unexpected": extra},
        )
    problems, counts = _layout_problems(specs, layouts)
    if not problems:
        problems = _annotation_problems(layouts, reserved, next(iter(counts.values())), values)
    if not problems:
        for name, size in _gather_vocab_sizes(model).items():
            array = values(name) if name in layouts else None
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
    return counts


def _reserved(specs: dict) -> set[str]:
    """The reserved names (``RESERVED``) that are not inputs of this model."""
    return {name for name in RESERVED if name not in specs}


def _annotation_problems(
    layouts: dict[str, tuple[np.dtype, tuple[int, ...]]],
    reserved: set[str],
    samples: int,
    values: Callable[[str], np.ndarray | None],
) -> list[str]:
    """What is wrong with the ``labels`` and ``groups`` arrays: their kind, and a first axis of one entry per
    sample or per row (a multiple of the samples: a fixed batch's rows); a sample's rows in two groups
    (``values(name)``: the array, or None to skip)."""
    problems = []
    for name in sorted(reserved & set(layouts)):
        dtype, shape = layouts[name]
        if not shape or not shape[0] or shape[0] % samples:
            problems.append(
                f"{name!r} has {shape[0] if shape else 'no'} entries on its first axis for {samples} samples: give one "
                "per sample (or per row of the inputs' first axis), stacked like the inputs"
            )
        elif name == "labels" and dtype.kind not in "iu":
            problems.append(f"'labels' is {dtype}: labels are class indices (convert with .astype(numpy.int64))")
        elif name == "groups" and (dtype.kind not in "iuUS" or len(shape) != 1):
            problems.append(
                f"'groups' is {dtype} {list(shape)}: give one integer or string per sample, a 1-D array (e.g. the "
                "name of the photo each crop was cut from)"
            )
        elif name == "groups" and shape[0] > samples:
            groups, step = values(name), shape[0] // samples
            if groups is not None and (groups.reshape(-1, step) != groups[::step, None]).any():
                problems.append(f"'groups' names two groups within one sample of {step} rows")
    return problems


def check_calibration_file(model: onnx.ModelProto, source: str | Path, *, max_read_bytes: int = 64 << 20) -> int:
    """``check_calibration`` for an ``.npz`` file, judged from its arrays' headers (dtype and shape): values are
    read only for inputs that index a table (their ids' range), each at most ``max_read_bytes`` (larger ones
    are left to ``check_calibration``, where the samples are used). What the service checks before queuing,
    without holding the samples: a 1 MB compressed upload can unpack to a GiB. Returns the number of samples."""
    layouts = read_layouts(source)
    vocab = _gather_vocab_sizes(model)
    with np.load(source, allow_pickle=False) as archive:

        def values(name: str) -> np.ndarray | None:
            dtype, shape = layouts[name]
            if name not in vocab and name not in RESERVED or dtype.itemsize * math.prod(shape) > max_read_bytes:
                return None
            return archive[name]

        counts = _check_fit(model, _input_specs(model), layouts, values)
    return min(next(iter(counts.values())), MAX_SAMPLES)


def check_calibration(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> CalibrationSamples:
    """The samples as feeds (one dict per ONNX Runtime run) with their labels and groups where the file has
    them (``CalibrationSamples``), or a ``CalibrationError`` saying what does not fit and how to fix it.
    ``model`` may be loaded without weights (shapes of Gather tables suffice)."""
    specs = _input_specs(model)
    layouts = {name: (array.dtype, array.shape) for name, array in arrays.items()}
    counts = _check_fit(model, specs, layouts, arrays.get)
    count = next(iter(counts.values()))
    samples = min(count, MAX_SAMPLES)
    feeds = []
    for index in range(samples):
        feed = {}
        for name, (_, dims) in specs.items():
            rows = dims[0] if isinstance(dims[0], int) and dims[0] > 0 else 1
            feed[name] = np.ascontiguousarray(arrays[name][index * rows : (index + 1) * rows])
        feeds.append(feed)
    reserved = _reserved(specs)
    labels = groups = None
    if "labels" in reserved and "labels" in arrays:  # one entry per sample, or per row of a fixed batch
        step = len(arrays["labels"]) // count
        labels = [arrays["labels"][i * step : (i + 1) * step].astype(np.int64).ravel() for i in range(samples)]
    if "groups" in reserved and "groups" in arrays:
        step = len(arrays["groups"]) // count
        groups = [arrays["groups"][i * step].item() for i in range(samples)]
    return CalibrationSamples(feeds, labels, groups)


def synthetic_samples(model: onnx.ModelProto, *, seed: int, count: int = SYNTHETIC_SAMPLES) -> list[dict]:
    """Seeded random samples of batch 1 (token ids inside the embedding table, masks of ones)."""
    return [make_inputs(model, seed=seed + index, dims={"batch": 1}) for index in range(count)]
