"""A large upload streams through the upload threads (parsed, hashed and written there, never on the event
loop) and arrives whole: the stored blob is the bytes sent, its key their sha256, no temp file lingers."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import service.upload
from service.upload import HANDOFF_BYTES


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
    feed = service.upload._feed

    def recording_feed(parser, pieces):
        fed_on.append(threading.current_thread().name)
        return feed(parser, pieces)

    monkeypatch.setattr(service.upload, "_feed", recording_feed)
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


def test_a_large_upload_is_made_durable_as_it_arrives_not_only_at_the_end(tmp_path, monkeypatch):
    """Fed in the API's 1 MiB pieces, a big upload is fdatasynced every ``SYNC_EVERY_BYTES`` on the way (so a
    small submit's own fsync never waits behind all of it), and the file is still whole."""
    from python_multipart.multipart import MultipartParser

    synced: list[int] = []
    fdatasync = service.upload.os.fdatasync

    def counting(fd):
        synced.append(fd)
        return fdatasync(fd)

    monkeypatch.setattr(service.upload.os, "fdatasync", counting)
    model = large_onnx(3 * service.upload.SYNC_EVERY_BYTES + 4321)
    boundary = b"flexdsa-test-boundary"
    body = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
        + model + b"\r\n--" + boundary + b"--\r\n"
    )
    receiver = service.upload._FormReceiver(tmp_path, limit=len(body))
    parser = MultipartParser(boundary, receiver.callbacks())
    service.upload._feed(parser, [body[i : i + HANDOFF_BYTES] for i in range(0, len(body), HANDOFF_BYTES)])
    result = receiver.finish()
    assert len(synced) >= 2, synced  # about one per SYNC_EVERY_BYTES (the final fsync is apart)
    assert result.path.read_bytes() == model and result.sha256 == hashlib.sha256(model).hexdigest()
