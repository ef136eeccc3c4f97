"""The content-addressed local artifact store, the choice of store from the settings, and the ONNX
wire-format check."""

from __future__ import annotations

import hashlib
import io

import pytest

from service.jobs.upload import NotOnnxError, check_onnx_structure
from service.storage.store import BlobNotFoundError, LocalStore
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


def test_the_settings_choose_the_store_and_presigned_urls_name_the_public_endpoint(tmp_path, monkeypatch):
    """FLEXDSA_ARTIFACT_URL picks the S3 store (no server needed: presigning is local), whose download URLs
    name the store as clients reach it; the credentials come from the environment, never the settings."""
    from service.core.config import Settings
    from service.storage.s3store import S3Store
    from service.storage.store import LocalStore, make_store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    assert isinstance(make_store(Settings(data_dir=tmp_path)), LocalStore)
    settings = Settings(
        data_dir=tmp_path, artifact_url="s3://models/flexdsa/prod", s3_endpoint_url="http://s3.internal:7480",
        s3_public_endpoint_url="https://store.example.com", presign_expiry_s=120,
    )  # fmt: skip
    store = make_store(settings, patient=True)
    assert isinstance(store, S3Store) and store.bucket == "models" and store.prefix == "flexdsa/prod"
    assert store.patience_s == settings.store_outage_patience_s and make_store(settings).patience_s == 0
    key = "ab" * 32
    assert store.object_key(key) == f"flexdsa/prod/ab/{key}"
    url = store.presigned_url(key, filename="model.onnx", content_type="application/octet-stream")
    assert url.startswith(f"https://store.example.com/models/flexdsa/prod/ab/{key}?")
    assert "X-Amz-Expires=120" in url and "response-content-disposition=attachment" in url
    assert "wJalrXUtnFEMI" not in url and "wJalrXUtnFEMI" not in settings.model_dump_json()
    with pytest.raises(ValueError):
        Settings(data_dir=tmp_path, artifact_url="https://not-s3/bucket")
