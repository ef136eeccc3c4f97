"""Runtime.update: the new version is verified and loaded before the switch; a bad one leaves the old in
service; and a process killed at any step of an update restarts on a complete, verified version."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from flexdsa_runtime import BundleError, Runtime, ShapeRefused
from tests.runtime.conftest import assert_close, original_outputs
from tests.runtime.test_runtime import masked_feeds
from tests.runtime.tiny_models import MASKED, model_bytes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def versions(make_bundle):
    """Two versions of the same model: the default buckets, then buckets re-specialised to seq 4 and 16."""
    old = make_bundle(model_bytes(MASKED), "cpu-ort", shape_buckets={"batch": [1], "seq": [8, 16]})
    new = make_bundle(model_bytes(MASKED), "cpu-ort", shape_buckets={"batch": [1], "seq": [4, 16]})
    return old, new


def zipped(folder: Path, path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as handle:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                handle.write(file, file.relative_to(folder).as_posix())
    return path


def test_update_switches_buckets_and_hands_back_the_old_traffic(versions, tmp_path):
    old, new = versions
    feeds = masked_feeds(1, 3)
    want = original_outputs(model_bytes(MASKED), feeds)
    with Runtime.open(old, store=tmp_path / "store") as runtime:
        first = runtime.version
        assert runtime.bucket_for(feeds) == "batch1_seq8"
        runtime.run(feeds)
        result = runtime.update(zipped(new, tmp_path / "new.zip"))
        assert result["previous_version"] == first and result["version"] == runtime.version != first
        assert result["previous_traffic"]["entries"][0]["bucket"] == "batch1_seq8"
        assert runtime.bucket_for(feeds) == "batch1_seq4"
        assert_close(want, runtime.run(feeds))
        assert runtime.traffic.snapshot()["bundle_version"] == runtime.version
    with Runtime.open(store=tmp_path / "store") as reopened:  # the switch is durable
        assert reopened.version == result["version"]


def test_a_version_serving_fewer_shapes_is_refused_naming_them(make_bundle, versions, tmp_path):
    """Re-specialised from traffic whose longest sequence was 8, a bundle of seq [4, 8] would refuse seq 9-16,
    which the version in service serves: update() refuses it, names the lost sizes, and keeps serving; asked
    to accept it, it switches."""
    old, _ = versions
    narrower = make_bundle(model_bytes(MASKED), "cpu-ort", shape_buckets={"batch": [1], "seq": [4, 8]})
    long_feeds = masked_feeds(1, 12)
    with Runtime.open(old, store=tmp_path / "store") as runtime:
        serving = runtime.version
        with pytest.raises(BundleError) as refused:
            runtime.update(narrower)
        assert refused.value.details["lost"] == {"seq": "9-16"}
        assert "seq 9-16" in str(refused.value) and "accept_narrower" in str(refused.value)
        assert runtime.version == serving and runtime.bucket_for(long_feeds) == "batch1_seq16"
        runtime.update(narrower, accept_narrower=True)
        assert runtime.version != serving
        with pytest.raises(ShapeRefused):
            runtime.run(long_feeds)


def test_a_corrupt_new_version_is_refused_and_the_old_keeps_serving(versions, tmp_path):
    old, new = versions
    broken = tmp_path / "broken"
    shutil.copytree(new, broken)
    model = next(broken.glob("model.*.onnx"))
    model.write_bytes(model.read_bytes()[:-10])
    with Runtime.open(old, store=tmp_path / "store") as runtime:
        before = runtime.version
        with pytest.raises(BundleError, match="truncated or replaced"):
            runtime.update(broken)
        assert runtime.version == before
        runtime.run(masked_feeds(1, 5))
    assert not any((tmp_path / "store" / "staging").iterdir())


# Each kill point: what the child patches to SIGKILL itself there, and the version it must restart on.
KILL_POINTS = {
    "while_unpacking": ("flexdsa_runtime.bundle", "_copy_member", 3, "old"),
    "before_the_version_folder_is_renamed": ("flexdsa_runtime.versions", "os.rename", 1, "old"),
    "while_loading_the_new_version": ("flexdsa_runtime.runtime", "load_backend", 2, "old"),
    "before_CURRENT_is_replaced": ("flexdsa_runtime.versions", "os.replace", 1, "old"),
    "after_the_switch_on_disk": ("flexdsa_runtime.runtime", "Traffic", 1, "new"),
}

CHILD = """
import importlib, os, signal, sys
from flexdsa_runtime import Runtime

store, new, module, attribute, nth = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
runtime = Runtime.open(store=store)
owner = importlib.import_module(module)
*path, name = attribute.split(".")
for part in path:  # e.g. the os module as flexdsa_runtime.versions sees it
    owner = getattr(owner, part)
original = getattr(owner, name)
calls = [0]

def killing(*args, **kwargs):
    calls[0] += 1
    if calls[0] >= nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)

setattr(owner, name, killing)
runtime.update(new)
print("finished without being killed")
"""


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_an_update_killed_midway_leaves_a_working_runtime(versions, tmp_path, point):
    old, new = versions
    module, name, nth, expected = KILL_POINTS[point]
    store = tmp_path / "store"
    with Runtime.open(old, store=store) as runtime:
        old_version = runtime.version
    new_zip = zipped(new, tmp_path / "new.zip")
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(store), str(new_zip), module, name, str(nth)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    feeds = masked_feeds(1, 3)
    with Runtime.open(store=store) as runtime:  # verifies every file of the version in service
        assert (runtime.version == old_version) == (expected == "old"), point
        assert_close(original_outputs(model_bytes(MASKED), feeds), runtime.run(feeds))
    assert not any((store / "staging").iterdir())
    assert not list(store.glob("CURRENT.tmp-*"))


def test_updates_killed_at_random_moments_always_restart_on_a_verified_version(versions, tmp_path):
    old, new = versions
    store = tmp_path / "store"
    with Runtime.open(old, store=store) as runtime:
        seen = {runtime.version}
    new_zip = zipped(new, tmp_path / "new.zip")
    script = (
        "import sys; from flexdsa_runtime import Runtime; Runtime.open(store=sys.argv[1]).update(sys.argv[2])"
    )
    rng = random.Random(7)
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", script, str(store), str(new_zip)], cwd=REPO)
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait()
        with Runtime.open(store=store) as runtime:
            runtime.run(masked_feeds(1, 3))
            seen.add(runtime.version)
    assert len(seen) <= 2
    manifest = json.loads((store / "versions" / next(iter(seen)) / "manifest.json").read_text())
    assert manifest["format"] == "flexdsa-bundle/1"
    assert np.all([p.is_dir() for p in (store / "versions").iterdir()])
