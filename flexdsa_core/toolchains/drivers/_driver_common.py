"""What every vendor driver shares: the request/result loop, the log capture, versions, saved outputs.

Runs inside each vendor toolchain's own environment, where flexdsa_core is not installed, so a driver
(``targets/<vendor>/driver.py``) puts this folder on ``sys.path`` and imports it by plain name
(``import _driver_common``); it is alone here so that nothing else on that path shadows a vendor's modules.
Standard library only at import time (numpy is imported where outputs are saved).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path


def run_request(
    request_path: str,
    result_path: str,
    handle_bucket: Callable[[dict, Path, dict], dict],
    packages: Iterable[str],
    extra: dict | None = None,
) -> int:
    """The core's contract: read ``request.json``, run ``handle_bucket(bucket, out_dir, options)`` per bucket
    until one reports an error, and always write ``result.json`` (``ok``, ``versions``, ``buckets``,
    ``error``, then ``extra``'s keys; ``log`` with the traceback when the driver itself failed).

    A bucket's own ``options`` are laid over the request's (candidates of one exploration differ in precision
    or switches). With ``continue_on_error`` in the request (an exploration: one candidate the vendor refuses
    must not stop the others) every bucket runs, each error stays in its own entry, and ``ok`` is true."""
    result: dict = {
        "ok": False,
        "versions": versions(packages),
        "buckets": [],
        "error": None,
        **(extra or {}),
    }
    try:
        request = json.loads(Path(request_path).read_text())
        out_dir = Path(request["out_dir"])
        out_dir.mkdir(parents=True, exist_ok=True)
        options = request.get("options") or {}
        keep_going = bool(request.get("continue_on_error"))
        for bucket in request["buckets"]:
            try:
                entry = handle_bucket(bucket, out_dir, {**options, **(bucket.get("options") or {})})
            except Exception as err:
                if not keep_going:
                    raise
                entry = {"name": bucket.get("name"), "error": f"{type(err).__name__}: {err}",
                         "log": traceback.format_exc()}  # fmt: skip
            result["buckets"].append(entry)
            if entry.get("error") and not keep_going:
                result["error"] = f"bucket {bucket['name']}: {entry['error']}"
                break
        else:
            result["ok"] = True
    except Exception as err:  # the core must always get a result.json with a plain message
        result["error"] = f"{type(err).__name__}: {err}"
        result["log"] = traceback.format_exc()
    Path(result_path).write_text(json.dumps(result, indent=2))
    return 0


def versions(packages: Iterable[str]) -> dict:
    """Installed version of each distribution (None where it is not installed)."""
    from importlib import metadata

    found = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def save_outputs(entry: dict, out_dir: Path, name: str, outputs: Iterable[tuple[str, object]]) -> None:
    """Save each (output name, array) as ``<bucket>.<output>.out.npy`` and record its path in the entry."""
    import numpy as np

    for output_name, array in outputs:
        path = out_dir / f"{name}.{safe(output_name)}.out.npy"
        np.save(path, np.asarray(array))
        entry["outputs"][output_name] = str(path)


@contextlib.contextmanager
def captured(prefix: str):
    """Send this process's stdout/stderr (vendor tools print from C/C++ as well as Python) to a file;
    yields its path."""
    sys.stdout.flush()
    sys.stderr.flush()
    handle = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".log", delete=False)
    saved = os.dup(1), os.dup(2)
    os.dup2(handle.fileno(), 1)
    os.dup2(handle.fileno(), 2)
    try:
        yield handle.name
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        handle.close()


def safe(name: str) -> str:
    """A tensor name made safe for a file name."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def load_samples(samples, input_names: list[str]) -> list[dict]:
    """Samples as the request gives them: lists of .npy paths in graph-input order, or dicts input name ->
    path; loaded as arrays."""
    import numpy as np

    found = []
    for sample in samples or []:
        paths = sample if isinstance(sample, dict) else dict(zip(input_names, sample, strict=True))
        found.append({k: np.load(v) for k, v in paths.items()})
    return found
