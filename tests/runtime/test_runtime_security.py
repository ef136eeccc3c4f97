"""The runtime against hostile input: a bundle (folder or zip) whose manifest names paths outside it, symlinks
or duplicate members; a zip that expands past the unpack limits; a manifest whose provider options would load
a library; and a service (or whoever answers for it) that redirects the API key elsewhere or serves bytes
other than those it stated. Each test is the attack, asserting that nothing lands outside and the refusal
names what was refused."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import shutil
import stat
import threading
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from flexdsa_runtime import BundleError, Runtime, VersionStore
from flexdsa_runtime.backends import load_backend
from flexdsa_runtime.bundle import BucketSpec, Bundle, unpack
from flexdsa_runtime.service_client import ServiceError, download_bundle, push_traffic
from tests.runtime.tiny_models import MASKED, model_bytes


@pytest.fixture(scope="module")
def masked(make_bundle):
    return make_bundle(model_bytes(MASKED), "cpu-ort", shape_buckets={"batch": [1], "seq": [8]})


def listed(manifest: dict, name: str, data: bytes) -> None:
    """``name`` added to the manifest's files with ``data``'s true size and sha256 (so only its path is wrong)."""
    manifest["files"][name] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "role": "script",
    }


def hostile_folder(masked: Path, folder: Path, name: str, data: bytes = b"attacker") -> Path:
    shutil.copytree(masked, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    listed(manifest, name, data)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def nothing_new_outside(root: Path, allowed: Path, before: set[Path]) -> None:
    written = {p for p in root.rglob("*") if not p.is_relative_to(allowed)} - before
    assert not written, f"written outside {allowed}: {sorted(map(str, written))}"


# ---- 1. paths: a bundle writes only inside the store, reads only inside itself ----------------------------


def test_a_manifest_entry_through_a_symlink_writes_nothing_outside_the_store(masked, tmp_path):
    # bundle/l -> evil/1/2/3/4, so bundle/l/../../../../victim reads evil/victim; written under the store's
    # staging folder, the same name climbs four folders up: staging/<id>/l -> <id> -> staging -> store -> tmp_path.
    entry = "l/../../../../victim"
    evil = tmp_path / "evil"
    (evil / "1" / "2" / "3" / "4").mkdir(parents=True)
    (evil / "victim").write_bytes(b"attacker")
    bundle = hostile_folder(masked, tmp_path / "bundle", entry)
    (bundle / "l").symlink_to(evil / "1" / "2" / "3" / "4")
    canary = tmp_path / "victim"
    store = VersionStore(tmp_path / "store")
    before = set(tmp_path.rglob("*"))
    with pytest.raises(BundleError, match=r"'l/\.\./\.\./\.\./\.\./victim'"):
        store.install(bundle)
    assert not canary.exists()
    nothing_new_outside(tmp_path, store.root, before)
    assert not any(store.versions.iterdir()) and not any(store.staging.iterdir())


@pytest.mark.parametrize(
    "entry",
    ["/{outside}/victim", "../victim", "a/../../victim", "a/./b", "a//b", "a\\..\\victim", "C:victim"],
)
def test_an_absolute_or_unnormalised_entry_is_refused_before_any_copy(masked, tmp_path, entry):
    outside = tmp_path / "outside"
    outside.mkdir()
    entry = entry.format(outside=str(outside).strip("/"))
    bundle = hostile_folder(masked, tmp_path / "bundle", entry)
    store = VersionStore(tmp_path / "store")
    copied = []
    real_copy = shutil.copyfile
    try:  # nothing at all is copied: the whole bundle is refused first
        shutil.copyfile = lambda *args, **kwargs: copied.append(args) or real_copy(*args, **kwargs)
        with pytest.raises(BundleError) as refused:
            store.install(bundle)
    finally:
        shutil.copyfile = real_copy
    assert repr(entry) in refused.value.message
    assert copied == []
    assert not (outside / "victim").exists()


def test_a_symlink_leaving_the_bundle_folder_is_refused_one_inside_it_is_followed(masked, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.pem").write_bytes(b"private")
    bundle = hostile_folder(masked, tmp_path / "bundle", "l/key.pem", b"private")
    (bundle / "l").symlink_to(secret)
    store = VersionStore(tmp_path / "store")
    with pytest.raises(BundleError, match=r"'l/key\.pem'.*outside the bundle folder"):
        store.install(bundle)
    assert not any(store.versions.iterdir())
    # The same folder, its link pointing inside itself (a deploy tool sharing identical files), installs.
    (bundle / "shared").mkdir()
    (bundle / "shared" / "key.pem").write_bytes(b"private")
    (bundle / "l").unlink()
    (bundle / "l").symlink_to(bundle / "shared")
    version = store.install(bundle)
    installed = store.folder(version) / "l" / "key.pem"
    assert installed.read_bytes() == b"private" and not installed.is_symlink()


def hostile_zip(masked: Path, path: Path, extra) -> Path:
    """``masked`` zipped, then ``extra(manifest, handle)`` adds the hostile members before the manifest."""
    manifest = json.loads((masked / "manifest.json").read_text())
    with zipfile.ZipFile(path, "w") as handle:
        for file in sorted(masked.iterdir()):
            if file.is_file() and file.name != "manifest.json":
                handle.write(file, file.name)
        extra(manifest, handle)
        handle.writestr("manifest.json", json.dumps(manifest))
    return path


def _symlink_member(manifest, handle):
    member = zipfile.ZipInfo("link.onnx")
    member.create_system = 3
    member.external_attr = (stat.S_IFLNK | 0o777) << 16
    handle.writestr(member, "/etc/passwd")
    listed(manifest, "link.onnx", b"/etc/passwd")


def _absolute_member(manifest, handle):
    handle.writestr("/tmp/flexdsa-canary", "attacker")
    listed(manifest, "/tmp/flexdsa-canary", b"attacker")


def _duplicate_member(manifest, handle):
    handle.writestr("notes.txt", "what the manifest's sha256 says")
    with pytest.warns(UserWarning, match="Duplicate name"):
        handle.writestr("notes.txt", "what a lenient unzipper takes")
    listed(manifest, "notes.txt", b"what the manifest's sha256 says")


@pytest.mark.parametrize(
    "extra, entry, reason",
    [
        (_symlink_member, "link.onnx", "symbolic link"),
        (_absolute_member, "/tmp/flexdsa-canary", "outside the bundle"),
        (_duplicate_member, "notes.txt", "more than once"),
    ],
)
@pytest.mark.parametrize("into", ["runtime", "store"])
def test_a_hostile_zip_member_is_refused_before_anything_is_written(
    masked, tmp_path, extra, entry, reason, into
):
    archive = hostile_zip(masked, tmp_path / "hostile.zip", extra)
    store = VersionStore(tmp_path / "store")
    before = set(tmp_path.rglob("*"))
    with pytest.raises(BundleError, match=reason) as refused:
        if into == "runtime":
            Runtime.open(archive)
        else:
            store.install(archive)
    assert repr(entry) in refused.value.message
    assert not Path("/tmp/flexdsa-canary").exists()
    nothing_new_outside(tmp_path, store.root, before)
    assert not any(store.staging.iterdir())
    out = tmp_path / "unpacked"
    with pytest.raises(BundleError, match=reason):
        unpack(archive, out)
    assert not out.exists() or not any(out.iterdir())


# ---- 2. size: a zip is unpacked only within its limits ---------------------------------------------------


def bomb(masked: Path, path: Path, size: int) -> Path:
    """A bundle zip with one member of ``size`` zero bytes (deflated to about size / 1000), listed truly."""
    zeros = bytes(size)

    def extra(manifest, handle):
        handle.writestr("zeros.bin", zeros, compress_type=zipfile.ZIP_DEFLATED)
        listed(manifest, "zeros.bin", zeros)

    return hostile_zip(masked, path, extra)


def test_a_zip_expanding_past_the_limit_is_refused_before_extracting(masked, tmp_path):
    from flexdsa_runtime import UnpackLimits

    archive = bomb(masked, tmp_path / "bomb.zip", 64 << 20)
    assert archive.stat().st_size < 1 << 20
    limits = UnpackLimits(max_bytes=16 << 20)
    out = tmp_path / "out"
    with pytest.raises(BundleError, match=r"'zeros\.bin'.*expands .* past the limit"):
        unpack(archive, out, limits=limits)
    assert not out.exists() or not any(out.iterdir())
    with pytest.raises(BundleError, match="past the limit"):
        Runtime.open(archive, unpack_limits=limits)
    store = tmp_path / "store"
    with pytest.raises(BundleError, match="past the limit"):
        Runtime.open(archive, store=store, unpack_limits=limits)
    assert not any((store / "staging").iterdir()) and not any((store / "versions").iterdir())
    with Runtime.open(archive, unpack_limits=UnpackLimits(max_bytes=128 << 20)) as runtime:
        assert runtime.version  # within a larger limit the same zip is a valid bundle


def test_a_zip_with_too_many_members_is_refused(masked, tmp_path):
    from flexdsa_runtime import UnpackLimits

    def extra(manifest, handle):
        for index in range(50):
            handle.writestr(f"part-{index}.txt", "x")
            listed(manifest, f"part-{index}.txt", b"x")

    archive = hostile_zip(masked, tmp_path / "many.zip", extra)
    with pytest.raises(BundleError, match="members"):
        unpack(archive, tmp_path / "out", limits=UnpackLimits(max_members=20))


def test_a_header_that_understates_the_size_does_not_get_past_the_limit(masked, tmp_path):
    from flexdsa_runtime import UnpackLimits

    archive = bomb(masked, tmp_path / "liar.zip", 64 << 20)
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as handle:
        info = handle.getinfo("zeros.bin")
    true_size = (64 << 20).to_bytes(4, "little")
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header, central directory
        start = data.find(signature, info.header_offset if signature == b"PK\x03\x04" else 0)
        while data[start + offset : start + offset + 4] != true_size:
            start = data.find(signature, start + 1)
        data[start + offset : start + offset + 4] = (1000).to_bytes(4, "little")  # "1000 bytes"
    archive.write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(BundleError, match="zeros.bin"):
        unpack(archive, out, limits=UnpackLimits(max_bytes=1 << 20))
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) <= 1 << 20
    assert not (out / "zeros.bin").exists()


# ---- 3. provider options: a manifest is data, never a library to load ----------------------------------


def qnn_bundle(tmp_path: Path, options: dict) -> tuple[Bundle, BucketSpec]:
    artifact = {"file": "model.qnn_ctx.onnx", "role": "qnn-context", "provider_options": options}
    manifest = {"buckets": [{"name": "b", "artifacts": [artifact]}], "files": {}, "runtime": {}}
    return Bundle(tmp_path, manifest, "0" * 64), BucketSpec("b", {}, [artifact])


@pytest.fixture
def sessions(monkeypatch):
    """What reaches ONNX Runtime's QNN EP (in process) or the bridge worker (qnn-emulator), recorded instead."""
    from flexdsa_runtime.backends import bridge, qnn

    calls = []
    monkeypatch.setattr(qnn, "available", lambda: True)
    monkeypatch.setattr(qnn, "qnn_session", lambda path, provider: calls.append(provider) or FakeSession())

    class FakeBridge:
        def __init__(self, backend, request, **kwargs):
            calls.append(request["provider"])

    monkeypatch.setattr(bridge, "BridgeBackend", FakeBridge)
    return calls


class FakeSession:
    def get_inputs(self):
        return []

    def get_outputs(self):
        return []

    def close(self):
        pass


@pytest.mark.parametrize("backend", ["qnn", "qnn-emulator"])
@pytest.mark.parametrize(
    "options, refused",
    [
        ({"backend_path": "{lib}"}, "backend_path"),
        ({"htp_arch": "73", "op_packages": "evil:{lib}:Fn:HTP"}, "op_packages"),
        (
            {"qnn_saver_path": "{lib}", "profiling_file_path": "/tmp/p.csv"},
            "profiling_file_path, qnn_saver_path",
        ),
        ({"backend_type": "saver"}, "backend_type"),
    ],
)
def test_manifest_provider_options_that_load_or_write_files_are_refused(
    tmp_path, sessions, backend, options, refused
):
    library = tmp_path / "libevil.so"
    library.write_bytes(b"\x7fELF")
    options = {key: value.format(lib=library) for key, value in options.items()}
    bundle, bucket = qnn_bundle(tmp_path, options)
    with pytest.raises(BundleError, match=refused):
        load_backend(bundle, bucket, backend)
    assert sessions == []  # refused before any session or worker was started


@pytest.mark.parametrize("backend", ["qnn", "qnn-emulator"])
def test_the_compilers_provider_options_pass_and_the_caller_chooses_the_library(tmp_path, sessions, backend):
    compiled = {"backend_type": "htp", "htp_arch": "73", "soc_model": "60"}
    bundle, bucket = qnn_bundle(tmp_path, compiled)
    load_backend(bundle, bucket, backend)
    caller = {"backend_path": "/opt/qnn/lib/libQnnHtp.so", "htp_performance_mode": "burst"}
    load_backend(bundle, bucket, backend, provider_options=caller)
    library_chosen = {"htp_arch": "73", "soc_model": "60", **caller}  # backend_path replaces backend_type
    assert sessions == [compiled, library_chosen]


def test_runtime_open_hands_the_callers_provider_options_to_every_bucket(masked, monkeypatch):
    from flexdsa_runtime import runtime as runtime_module

    seen = []

    def loading(bundle, bucket, backend, **kwargs):
        seen.append((backend, kwargs.get("provider_options")))
        return FakeSession()

    monkeypatch.setattr(runtime_module, "load_backend", loading)
    Runtime.open(masked, backend="qnn", provider_options={"backend_path": "/opt/qnn/libQnnHtp.so"})
    assert seen == [("qnn", {"backend_path": "/opt/qnn/libQnnHtp.so"})]


# ---- 4. the service client: the key stays with the service, the bundle is the one it stated -------------


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers from ``self.server.routes`` (path -> (status, headers, body)) and records each request (its
    path, its headers by lower-case name)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.seen.append((self.path, {name.lower(): value for name, value in self.headers.items()}))
        status, headers, body = self.server.routes.get(self.path.split("?")[0], (404, {}, b"{}"))
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@contextmanager
def serving():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.routes, server.seen = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def repr_digest(data: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"


BUNDLE_ROUTE = "/jobs/j1/artifacts/bundle.zip"


@contextmanager
def service_and_store(stated: bytes, served: bytes):
    """A "service" that answers the bundle route with a 307 to a presigned URL at a "store" (another port,
    another origin) and states the sha256 of ``stated``; the store serves ``served``."""
    with serving() as (service, service_url), serving() as (store, store_url):
        location = f"{store_url}/bucket/bundle.zip?X-Amz-Signature=abc"
        service.routes[BUNDLE_ROUTE] = (307, {"Location": location, "Repr-Digest": repr_digest(stated)}, b"")
        store.routes["/bucket/bundle.zip"] = (200, {"Content-Type": "application/zip"}, served)
        yield service, service_url, store


def test_the_api_key_is_not_sent_to_the_store_the_service_redirects_to(tmp_path):
    body = b"PK\x05\x06" + bytes(18)  # an empty zip: what it holds does not matter here
    with service_and_store(body, body) as (service, service_url, store):
        saved = download_bundle(service_url, "j1", tmp_path / "bundle.zip", api_key="secret-key")
    assert saved.read_bytes() == body
    assert service.seen[0][1].get("x-api-key") == "secret-key"
    assert [path for path, _ in store.seen] == ["/bucket/bundle.zip?X-Amz-Signature=abc"]
    assert "x-api-key" not in store.seen[0][1] and "authorization" not in store.seen[0][1]


def test_a_same_origin_redirect_keeps_the_key(tmp_path):
    body = b"bundle bytes"
    with serving() as (service, url):
        service.routes["/jobs/j1/traffic"] = (307, {"Location": f"{url}/v2/jobs/j1/traffic"}, b"")
        service.routes["/v2/jobs/j1/traffic"] = (200, {"Content-Type": "application/json"}, b'{"ok": true}')
        service.routes[BUNDLE_ROUTE] = (307, {"Location": "/blobs/b1", "Repr-Digest": repr_digest(body)}, b"")
        service.routes["/blobs/b1"] = (200, {}, body)
        assert download_bundle(url, "j1", tmp_path / "b.zip", api_key="k").read_bytes() == body
    assert [headers.get("x-api-key") for _, headers in service.seen] == ["k", "k"]


def test_a_bundle_other_than_the_one_the_service_stated_is_refused(tmp_path):
    destination = tmp_path / "bundle.zip"
    with service_and_store(b"the job's bundle", b"a tampered bundle") as (_, service_url, _):
        with pytest.raises(ServiceError, match="sha-256 the service stated") as refused:
            download_bundle(service_url, "j1", destination, api_key="k")
    assert refused.value.details["expected"] == hashlib.sha256(b"the job's bundle").hexdigest()
    assert list(tmp_path.iterdir()) == []  # neither the bundle nor its .part


def test_a_bundle_without_a_stated_digest_is_refused(tmp_path):
    with serving() as (service, url):
        service.routes[BUNDLE_ROUTE] = (200, {"Content-Type": "application/zip"}, b"unverifiable")
        with pytest.raises(ServiceError, match="Repr-Digest"):
            download_bundle(url, "j1", tmp_path / "bundle.zip")
    assert list(tmp_path.iterdir()) == []


def test_a_redirect_to_another_scheme_is_not_followed(tmp_path):
    with serving() as (service, url):
        service.routes[BUNDLE_ROUTE] = (307, {"Location": "ftp://127.0.0.1/bundle.zip"}, b"")
        with pytest.raises(ServiceError, match="ftp"):
            download_bundle(url, "j1", tmp_path / "bundle.zip", api_key="k")
        service.routes["/jobs/j1/traffic"] = (200, {}, b'{"entries": 0}')
        assert push_traffic(url, "j1", {"entries": []}, api_key="k") == {"entries": 0}
    assert list(tmp_path.iterdir()) == []
