"""A job whose artifacts cannot be written because the service's disk is full fails saying so
(``insufficient_storage``), not as a bug with an incident; another I/O error stays an internal error with its
incident. ``workers.child.run`` is called in this process, as the pipeline process calls it; the disk's
refusal is injected at the artifact store's write."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

import service.storage.store
from service.core.config import Settings
from service.storage.store import make_store
from tests.service.conftest import tiny_onnx
from workers import child


class _Collecting:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    def send(self, message: dict) -> None:
        self.messages.append(message)


def _run_with_failing_store(tmp_path, monkeypatch, failure: int) -> dict:
    settings = Settings(data_dir=tmp_path / "data", job_memory_limit_mb=None)
    store = make_store(settings)
    model_key = store.put_bytes(tiny_onnx())

    def refusing(self, data):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(service.storage.store.LocalStore, "put_bytes", refusing)
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # run() points it at the job's folder
    work_dir = tmp_path / "job"
    work_dir.mkdir()
    request = {
        "work_dir": str(work_dir),
        "tenant_id": 1,
        "model_blob_key": model_key,
        "model_filename": "model.onnx",
        "spec": {"target": "cpu-ort", "measure_latency": False},
        "settings": settings.model_dump(mode="json", exclude={"operator_token"}),
    }
    return child.run(request, _Collecting())


def test_a_full_disk_fails_the_job_as_storage_not_as_a_bug(tmp_path, monkeypatch):
    result = _run_with_failing_store(tmp_path, monkeypatch, errno.ENOSPC)
    assert result["type"] == "error"
    assert result["code"] == "insufficient_storage", result
    assert "nothing is wrong with the model" in result["message"]
    assert "incident" not in result["details"]


@pytest.mark.parametrize("failure", [errno.EIO, errno.EACCES])
def test_another_disk_error_stays_an_internal_error_with_its_incident(tmp_path, monkeypatch, failure):
    result = _run_with_failing_store(tmp_path, monkeypatch, failure)
    assert result["code"] == "internal_error", result
    assert result["details"]["incident"] in result["message"]
    assert "OSError" in result["incident_traceback"]
