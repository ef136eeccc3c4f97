"""The content-addressed local artifact store and the ONNX wire-format check."""

from __future__ import annotations

import hashlib
import io

import pytest

from service.storage import BlobNotFoundError, LocalStore
from service.upload import NotOnnxError, check_onnx_structure
from tests.service.conftest import tiny_onnx


def test_put_is_content_addressed_and_stored_once(tmp_path):
    store = LocalStore(tmp_path)
    key = store.put_bytes(b"hello")
    assert key == hashlib.sha256(b"hello").hexdigest()
    assert store.put_stream(io.BytesIO(b"hello")) == key
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [store.path(key)]
    assert store.read_bytes(key) == b"hello" and store.size(key) == 5 and store.exists(key)
    assert b"".join(store.iter_chunks(key, chunk_size=2)) == b"hello"
    store.delete(key)
    assert not store.exists(key)
    with pytest.raises(BlobNotFoundError):
        store.open(key)


def test_put_file_move_renames_into_place(tmp_path):
    store = LocalStore(tmp_path / "store")
    staged = store.staging_dir() / "upload-x"
    staged.parent.mkdir(parents=True, exist_ok=True)
    staged.write_bytes(b"model")
    key = store.put_file(staged, key=hashlib.sha256(b"model").hexdigest(), move=True)
    assert not staged.exists() and store.read_bytes(key) == b"model"
    staged.write_bytes(b"model")  # the same content again: stored once, the temp file consumed
    assert store.put_file(staged, key=key, move=True) == key and not staged.exists()


def test_failed_write_leaves_no_blob(tmp_path):
    store = LocalStore(tmp_path)

    class Broken(io.RawIOBase):
        def read(self, size=-1):
            raise OSError("disk went away")

    with pytest.raises(OSError):
        store.put_stream(Broken())
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_keys_cannot_escape_the_store(tmp_path):
    with pytest.raises(ValueError):
        LocalStore(tmp_path).path("../../etc/passwd")


def test_onnx_check_accepts_real_models(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(tiny_onnx())
    check_onnx_structure(path)


@pytest.mark.parametrize("cut", [1, 10, 30, 60, -1])
def test_onnx_check_refuses_every_truncation(tmp_path, cut):
    path = tmp_path / "m.onnx"
    path.write_bytes(tiny_onnx()[:cut])
    with pytest.raises(NotOnnxError):
        check_onnx_structure(path)
