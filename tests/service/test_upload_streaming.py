"""A large upload streams through the upload threads (parsed, hashed and written there, never on the event
loop) and arrives whole: the stored blob is the bytes sent, its key their sha256, no temp file lingers."""

from __future__ import annotations

import errno
import hashlib
import os
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import service.jobs.upload
from service.core.models import Job
from service.jobs.upload import HANDOFF_BYTES


def large_onnx(size_bytes: int) -> bytes:
    count = size_bytes // 4
    weight = np.random.default_rng(7).standard_normal(count, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _threads_feeding_the_parser(monkeypatch) -> list[str]:
    """The names of the threads that feed the upload's parser, in order, as the test's request goes on."""
    fed_on: list[str] = []
    feed = service.jobs.upload._feed

    def recording_feed(parser, pieces):
        fed_on.append(threading.current_thread().name)
        return feed(parser, pieces)

    monkeypatch.setattr(service.jobs.upload, "_feed", recording_feed)
    return fed_on


def test_large_upload_is_hashed_on_the_upload_threads_and_stored_whole(env, headers, monkeypatch):
    fed_on = _threads_feeding_the_parser(monkeypatch)
    model = large_onnx(5 * HANDOFF_BYTES + 12345)  # several pieces and a tail that is not a whole piece
    response = env.submit(headers, model=model)
    assert response.status_code == 202, response.text
    job = env.job(response.json()["job_id"])
    assert job.model_size == len(model)
    assert job.model_sha256 == hashlib.sha256(model).hexdigest() == job.model_blob_key
    assert env.store.read_bytes(job.model_blob_key) == model
    assert not list(env.store.staging_dir().glob("upload-*")), "upload temp files must not linger"
    # Every piece went to an upload thread (the test client sends the body in a few large chunks), the tail
    # with the fsync as well.
    assert fed_on
    assert all(name.startswith("flexdsa-upload") for name in fed_on), fed_on


def test_small_upload_is_parsed_in_one_request_thread_call(env, headers, monkeypatch):
    fed_on = _threads_feeding_the_parser(monkeypatch)
    response = env.submit(headers)
    assert response.status_code == 202, response.text
    # One parse call, off the event loop and off the upload threads (it shares the call that records the job).
    assert len(fed_on) == 1
    assert fed_on[0] != "MainThread" and not fed_on[0].startswith("flexdsa-upload"), fed_on


def _multipart(model: bytes, boundary: bytes = b"flexdsa-test-boundary") -> tuple[bytes, bytes]:
    body = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
        + model + b"\r\n--" + boundary + b"--\r\n"
    )
    return boundary, body


def _receive(tmp_path, body: bytes, boundary: bytes, on_piece=None):
    """Feed ``body`` to a receiver the way the API does (HANDOFF_BYTES pieces); ``on_piece(receiver)``
    after each. Returns the ``ReceivedUpload``."""
    from python_multipart.multipart import MultipartParser

    receiver = service.jobs.upload._FormReceiver(tmp_path, limit=len(body))
    parser = MultipartParser(boundary, receiver.callbacks())
    for offset in range(0, len(body), HANDOFF_BYTES):
        service.jobs.upload._feed(parser, [body[offset : offset + HANDOFF_BYTES]])
        if on_piece is not None:
            on_piece(receiver)
    return receiver.finish()


def test_a_large_upload_goes_to_disk_as_it_arrives_bypassing_the_page_cache(tmp_path):
    """Where the filesystem takes O_DIRECT (this one does: it is checked first), the model's bytes are written
    to the disk as they arrive, from the aligned buffer, with no copy in the page cache and nothing dirty
    left behind for a small submit's fsync to wait on; the file is whole, tail included."""
    import fcntl
    import os

    probe = service.jobs.upload.StagedFile(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT, 0o600))
    direct = probe._direct
    probe.close()
    if not direct:
        pytest.skip("this filesystem refuses O_DIRECT (the buffered path is tested below)")
    model = large_onnx(3 * service.jobs.upload.DIRECT_WRITE_BYTES + 4321)  # whole buffers and a ragged tail
    boundary, body = _multipart(model)
    seen: list[tuple[bool, int]] = []

    def on_piece(receiver):
        handle = receiver._handle
        flags = fcntl.fcntl(handle.fd, fcntl.F_GETFL)
        seen.append((bool(flags & os.O_DIRECT), os.fstat(handle.fd).st_size))

    result = _receive(tmp_path, body, boundary, on_piece)
    assert all(is_direct for is_direct, _ in seen), seen
    # The file grows by whole buffers while the body is still arriving (not all at the end).
    sizes = [size for _, size in seen]
    assert sizes[len(sizes) // 2] >= service.jobs.upload.DIRECT_WRITE_BYTES, sizes
    assert result.path.read_bytes() == model and result.sha256 == hashlib.sha256(model).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 1024 * 1024, 1024 * 1024 + 1, 3 * 1024 * 1024 - 7])
def test_staged_file_writes_every_size_whole(tmp_path, size):
    """Empty, under one block, one block, one buffer, a buffer and a byte: the bytes on disk are the bytes
    written, whatever part of them went through O_DIRECT."""
    import os

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "staged"
    staged = service.jobs.upload.StagedFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    view = memoryview(data)
    for offset in range(0, size, 65_521):  # pieces that never line up with a block
        staged.write(view[offset : offset + 65_521])
    staged.commit()
    assert path.read_bytes() == data


def test_without_o_direct_a_large_upload_is_made_durable_every_few_mib(tmp_path, monkeypatch):
    """Where O_DIRECT is refused, the upload is written through the page cache and fdatasynced every
    ``SYNC_EVERY_BYTES`` on the way (so a small submit's own fsync never waits behind all of it)."""
    synced: list[int] = []
    fdatasync = service.jobs.upload.os.fdatasync

    def counting(fd):
        synced.append(fd)
        return fdatasync(fd)

    monkeypatch.setattr(service.jobs.upload, "_try_direct", lambda fd: False)
    monkeypatch.setattr(service.jobs.upload.os, "fdatasync", counting)
    model = large_onnx(3 * service.jobs.upload.SYNC_EVERY_BYTES + 4321)
    boundary, body = _multipart(model)
    result = _receive(tmp_path, body, boundary)
    assert len(synced) >= 2, synced  # about one per SYNC_EVERY_BYTES (the final fsync is apart)
    assert result.path.read_bytes() == model and result.sha256 == hashlib.sha256(model).hexdigest()


def test_a_write_o_direct_refuses_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    """Some filesystems let O_DIRECT be set and refuse the write itself (EINVAL): the first buffer is written
    again through the page cache and the upload goes on."""
    import errno
    import os

    calls = {"n": 0}
    write = os.write

    def refusing_once(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return write(fd, data)

    monkeypatch.setattr(service.jobs.upload.os, "write", refusing_once)
    data = np.random.default_rng(3).integers(0, 256, 2 * service.jobs.upload.DIRECT_WRITE_BYTES + 99, dtype=np.uint8).tobytes()
    path = tmp_path / "staged"
    staged = service.jobs.upload.StagedFile(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    if not staged._direct:
        staged.close()
        pytest.skip("this filesystem refuses O_DIRECT outright")
    staged.write(memoryview(data))
    staged.commit()
    assert path.read_bytes() == data and not staged._direct


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [(errno.ENOSPC, 507, "insufficient_storage"), (errno.EIO, 503, "storage_unavailable")],
)
@pytest.mark.parametrize("size", [1000, 3 * HANDOFF_BYTES + 17], ids=["small", "streamed"])
def test_a_disk_that_refuses_the_upload_is_the_services_fault_not_the_clients(
    env, headers, monkeypatch, failure, status, code, size
):
    """A full disk is 507, another write error 503, both with Retry-After; never 'could not be parsed'
    (422) or a bare 500, nothing queued and no temp file left behind. The disk's refusal is injected at
    the one write call every staged byte goes through."""

    def refusing_write(fd, data):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(service.jobs.upload, "_write_all", refusing_write)
    with env.sessions() as session:
        jobs_before = session.query(Job).count()
    response = env.submit(headers, model=large_onnx(size))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert "nothing was queued" in error["message"]
    assert response.headers["retry-after"].isdigit()
    assert env.enqueued == []
    with env.sessions() as session:
        assert session.query(Job).count() == jobs_before
    staging = env.store.staging_dir()
    assert not list(staging.glob("upload-*")), "a refused upload must not leave its temp file"
