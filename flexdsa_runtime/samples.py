"""The samples a bundle ships for a bucket, and which of them its vendor build calibrated on.

A bundle whose precision a vendor's own quantiser made (rknn-toolkit2, QNN, ...) ships the job's samples: per
bucket a listing (``dataset.txt`` for the first bucket, ``dataset.<bucket>.txt`` for the others), one sample a
line, one ``.npy`` per input under ``calibration/``, every file in ``manifest.json`` with its sha256. The job split
them: the vendor's quantiser calibrated on a part, its simulator judged the rest (held out). Which is which the
compiled artifact's build record says (rknn: ``model.<bucket>.rknn.build.json``), by the sha256 of each
calibration sample's files; matched against the manifest's checksums (verified when the bundle was opened), the
samples split again exactly as the job split them, with nothing but the manifest read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexdsa_runtime.bundle import BucketSpec, Bundle
from flexdsa_runtime.errors import BundleError

_LISTING = re.compile(r"dataset(\..+)?\.txt")
_SAMPLE_FILE = re.compile(r"\d+_(?P<input>.+)\.npy")


@dataclass(frozen=True)
class BucketSamples:
    """A bucket's shipped samples: each one input name -> bundle file, in the listing's order. Where a build
    record names them: ``calibrated``, the indices the build calibrated on, and ``judged``, those the job judged its
    simulator run on (None: not recorded, or not all in the bundle: ``unmatched`` counts those missing)."""

    listing: str | None = None
    samples: list[dict[str, str]] = field(default_factory=list)
    calibrated: list[int] | None = None
    judged: list[int] | None = None
    unmatched: int = 0

    @property
    def held_out(self) -> list[int]:
        """The samples the build did not calibrate on (all of them where that is not recorded)."""
        taken = set(self.calibrated or ())
        return [index for index in range(len(self.samples)) if index not in taken]


def safe_name(name: str) -> str:
    """An input's name as the compiler writes it into a calibration file's name (``precision.samples_dataset``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def listing_of(bundle: Bundle, bucket: BucketSpec) -> str | None:
    """The bucket's calibration listing (``dataset*.txt`` with role ``calibration``), or None."""
    for name, entry in bundle.manifest["files"].items():
        base = name.rsplit("/", 1)[-1]
        if (
            entry.get("role") == "calibration"
            and entry.get("bucket") == bucket.name
            and _LISTING.fullmatch(base)
        ):
            return name
    return None


def bucket_samples(bundle: Bundle, bucket: BucketSpec, record: dict[str, Any] | None = None) -> BucketSamples:
    """The bucket's shipped samples, split as ``record`` (a build record's ``calibration``: per sample, input
    name -> sha256 of its file) says where one is given."""
    listing = listing_of(bundle, bucket)
    if listing is None:
        return BucketSamples()
    names = input_names(bundle, bucket)
    files = bundle.manifest["files"]
    samples = []
    for number, line in enumerate(bundle.path(listing).read_text().splitlines(), 1):
        if not line.strip():
            continue
        paths = line.split()
        for path in paths:
            if path not in files:
                raise BundleError(
                    f"{listing} line {number} names {path!r}, which manifest.json does not list: the calibration "
                    "set is incomplete or was edited; fetch the bundle again.",
                    details={"listing": listing, "file": path},
                )
        samples.append(_by_input(paths, names, listing, number))
    if not record:
        return BucketSamples(listing, samples)
    digests = [{name: files[path]["sha256"] for name, path in sample.items()} for sample in samples]
    calibrated, missing = _matched(digests, record.get("calibration"))
    judged, missing_judged = _matched(digests, record.get("judged"))
    return BucketSamples(listing, samples, calibrated, judged, missing + missing_judged)


def _matched(
    digests: list[dict[str, str]], wanted: list[dict[str, str]] | None
) -> tuple[list[int] | None, int]:
    """The indices of the ``wanted`` samples (input -> sha256) among ``digests``, in ``wanted``'s order, and how
    many are not there (then None: a partial set is not the set the record names)."""
    if not wanted:
        return None, 0
    found = []
    for sample in wanted:
        index = next((i for i, have in enumerate(digests) if have == sample and i not in found), None)
        if index is not None:
            found.append(index)
    missing = len(wanted) - len(found)
    return (None if missing else found), missing


def runtime_inputs(bundle: Bundle, bucket: BucketSpec) -> list[dict[str, Any]]:
    """The bucket's inputs a caller feeds, in the model's order (name, shape, dtype): the manifest's bucket
    ``inputs`` without the weights an older exporter also lists as graph inputs (those ``runtime.inputs``, the
    request's inputs, does not name), else ``runtime.inputs`` by name."""
    fed = bundle.runtime.get("inputs") or {}
    if bucket.inputs:
        return [i for i in bucket.inputs if not fed or i["name"] in fed]
    return [{"name": name, "shape": shape} for name, shape in fed.items()]


def input_names(bundle: Bundle, bucket: BucketSpec) -> list[str]:
    """The names of ``runtime_inputs``."""
    return [i["name"] for i in runtime_inputs(bundle, bucket)]


def load(bundle: Bundle, sample: dict[str, str]) -> dict[str, np.ndarray]:
    """One sample's arrays (plain .npy, no pickles)."""
    return {name: np.load(bundle.path(path), allow_pickle=False) for name, path in sample.items()}


def _by_input(paths: list[str], names: list[str], listing: str, number: int) -> dict[str, str]:
    """A listing line's files by input: by the input named in each file name (``NNN_<input>.npy``), else, with one
    file per input, in the model's input order (how the listing is written)."""
    safe = {safe_name(name): name for name in names}
    found = {}
    for path in paths:
        match = _SAMPLE_FILE.fullmatch(path.rsplit("/", 1)[-1])
        name = safe.get(match["input"]) if match else None
        if name is None or name in found:
            break
        found[name] = path
    else:
        if set(found) == set(names):
            return found
    if len(paths) == len(names):
        return dict(zip(names, paths, strict=True))
    raise BundleError(
        f"{listing} line {number} has {len(paths)} file(s) for the bucket's {len(names)} input(s) ({', '.join(names)}).",
        details={"listing": listing, "line": number},
    )
