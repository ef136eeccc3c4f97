"""`flexdsa serve --workers N`: N API processes behind one port, each with its embedded worker, on one SQLite
database: every submit is answered, every job runs once and only once."""

from __future__ import annotations

import concurrent.futures

import httpx
import psutil

from tests.service.live import BERT, embedded_server, wait_for_job


def test_two_api_processes_share_the_port_and_run_each_job_once(tmp_path):
    with embedded_server(tmp_path, workers=2, test_optimizer="tests.workers.standin:StandInOptimizer") as server:
        processes = [p for p in psutil.Process(server.pid).children(recursive=True) if "python" in p.name()]
        api_processes = [p for p in processes if any("multiprocessing" in part for part in p.cmdline())]
        assert len(api_processes) >= 2, [p.cmdline() for p in processes]

        def submit(seed: int) -> str:
            response = httpx.post(
                f"{server.url}/optimize",
                files={"model": ("bert.onnx", BERT.read_bytes(), "application/octet-stream")},
                data={"spec": f'{{"target": "cpu-ort", "seed": {seed}}}'},
                timeout=60,
            )
            assert response.status_code == 202, response.text
            return response.json()["job_id"]

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            job_ids = list(pool.map(submit, range(6)))
        jobs = [wait_for_job(server.url, job_id) for job_id in job_ids]
        assert [job["status"] for job in jobs] == ["succeeded"] * 6, jobs
        assert all(job["attempts"] == 1 for job in jobs), [job["attempts"] for job in jobs]
        listed = httpx.get(f"{server.url}/jobs", timeout=10).json()["items"]
        assert sorted(j["id"] for j in listed) == sorted(job_ids)


def test_serve_starts_one_api_process_per_core_by_default_bounded_and_overridable(monkeypatch, tmp_path):
    import os

    from service.core.config import MAX_DEFAULT_API_WORKERS, Settings

    monkeypatch.delenv("FLEXDSA_API_WORKERS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert Settings(data_dir=tmp_path).api_processes() == min(cores, MAX_DEFAULT_API_WORKERS)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))  # a big machine: bounded
    assert Settings(data_dir=tmp_path).api_processes() == MAX_DEFAULT_API_WORKERS
    assert Settings(data_dir=tmp_path, api_workers=1).api_processes() == 1  # --workers 1
    monkeypatch.setenv("FLEXDSA_API_WORKERS", "3")
    assert Settings(data_dir=tmp_path).api_processes() == 3
