"""POST /optimize and the job lifecycle seen through the API: submission, idempotency, the whole-job cache,
listing, cancellation, artifacts and the progress stream."""

from __future__ import annotations

import json
import threading
import time

from sqlalchemy import func, select

from service.core.models import Artifact, Job, JobEvent
from service.jobs.gates import without_gates
from tests.service.conftest import tiny_onnx


def test_submit_creates_queued_job_and_enqueues_after_commit(env, headers):
    response = env.submit(headers, spec={"target": "cpu-ort", "objective": "energy"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status"] == "queued" and body["cached"] is False
    assert body["status_url"] == f"/jobs/{body['job_id']}"
    job = env.job(body["job_id"])
    assert job.status == "queued" and job.target == "cpu-ort"
    assert job.spec["objective"] == "energy"
    assert job.model_size == len(tiny_onnx()) and job.model_filename == "model.onnx"
    assert env.store.read_bytes(job.model_blob_key) == tiny_onnx()
    assert [e.kind for e in job.events] == ["queued"]
    assert env.enqueued == [job.id]


def test_identical_uploads_are_stored_once(env, headers):
    first = env.submit(headers, spec={"target": "cpu-ort"}).json()
    second = env.submit(headers, spec={"target": "cpu-ort", "objective": "balanced"}).json()
    one, two = env.job(first["job_id"]), env.job(second["job_id"])
    assert one.id != two.id and one.job_cache_key != two.job_cache_key
    assert one.model_blob_key == two.model_blob_key
    blob_dir = env.store.path(one.model_blob_key).parent
    assert [p.name for p in blob_dir.iterdir()].count(one.model_blob_key) == 1
    assert not list(env.store.staging_dir().glob("upload-*")), "upload temp files must not linger"


def test_idempotent_retry_returns_the_same_job(env, headers):
    first = env.submit(headers, idempotency_key="build-42")
    retry = env.submit(headers, idempotency_key="build-42")
    assert first.status_code == retry.status_code == 202
    assert retry.json()["job_id"] == first.json()["job_id"]
    assert retry.headers["Idempotent-Replayed"] == "true"
    with env.sessions() as session:
        count = session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.idempotency_key == "build-42", Job.id == first.json()["job_id"])
        )
    assert count == 1
    assert env.enqueued == [first.json()["job_id"]]
    # The same key from another tenant is another job.
    other = env.submit(env.new_key(), idempotency_key="build-42")
    assert other.json()["job_id"] != first.json()["job_id"]


def test_concurrent_idempotent_submissions_make_one_job(env, headers):
    results = []

    def post():
        results.append(env.submit(headers, idempotency_key="race-1").json()["job_id"])

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len(set(results)) == 1


def test_whole_job_cache_answers_identical_request_at_once(env, headers):
    spec = {"target": "cpu-ort", "objective": "latency"}
    first = env.submit(headers, spec=spec).json()["job_id"]
    env.finish(
        first,
        artifacts={"bundle.zip": b"PK-zip-bytes", "report.json": b'{"ok": true}'},
        report={"fusions": 4},
    )
    again = env.submit(headers, spec=spec)
    body = again.json()
    assert again.status_code == 202 and body["cached"] is True and body["status"] == "succeeded"
    cached = env.job(body["job_id"])
    assert cached.cached_from_job_id == first and without_gates(cached.report_summary) == {"fusions": 4}
    assert cached.report_summary["previous"]["job_id"] == first  # judged as itself, against its predecessor
    original = env.job(first)
    assert {(a.name, a.blob_key) for a in cached.artifacts} == {
        (a.name, a.blob_key) for a in original.artifacts
    }
    assert body["job_id"] not in env.enqueued
    download = env.client.get(f"/jobs/{body['job_id']}/artifacts/bundle.zip", headers=headers)
    assert download.status_code == 200 and download.content == b"PK-zip-bytes"
    # The cache is per tenant: another tenant's identical request runs.
    other = env.submit(env.new_key(), spec=spec).json()
    assert other["cached"] is False and other["status"] == "queued"


def _install_toolchain_marker(root, name: str, versions: dict[str, str]) -> None:
    """Make toolchain ``name`` ready under ``root`` the way ``Toolchain.install`` leaves it: its environment's
    python and, written last, ``ready.json`` naming the code's pins and the installed versions."""
    from flexdsa_core.toolchains import get_toolchain

    toolchain = get_toolchain(name)
    python = toolchain.python(root)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n")
    (toolchain.home(root) / "ready.json").write_text(
        json.dumps({"requirements": [list(g) for g in toolchain.requirements], "versions": versions})
    )


def test_a_toolchain_installed_after_a_job_makes_the_same_submission_recompile(env, headers, tmp_path, monkeypatch):
    monkeypatch.setattr(env.settings, "toolchains_dir", tmp_path / "toolchains")
    spec = {"target": "rockchip-rk3588"}
    before = env.submit(headers, spec=spec).json()
    env.finish(before["job_id"], artifacts={"bundle.zip": b"PK-without-rknn"})
    assert env.submit(headers, spec=spec).json()["cached"] is True  # nothing changed yet

    _install_toolchain_marker(tmp_path / "toolchains", "rockchip", {"rknn-toolkit2": "2.3.2"})
    targets = {t["name"]: t for t in env.client.get("/targets", headers=headers).json()}
    assert targets["rockchip-rk3588"]["toolchain_ready"] is True
    after = env.submit(headers, spec=spec).json()
    assert after["cached"] is False and after["status"] == "queued" and after["job_id"] in env.enqueued
    env.finish(after["job_id"], artifacts={"bundle.zip": b"PK-with-rknn"})
    again = env.submit(headers, spec=spec).json()
    assert again["cached"] is True and env.job(again["job_id"]).cached_from_job_id == after["job_id"]

    # Other versions installed: another toolchain state, another run.
    _install_toolchain_marker(tmp_path / "toolchains", "rockchip", {"rknn-toolkit2": "2.4.0"})
    assert env.submit(headers, spec=spec).json()["cached"] is False
    # A target without a toolchain is untouched by any of this: cpu-ort still answers from its cache.
    cpu = env.submit(headers, spec={"target": "cpu-ort"}).json()
    env.finish(cpu["job_id"])
    assert env.submit(headers, spec={"target": "cpu-ort"}).json()["cached"] is True


def test_cache_refresh_runs_again_and_then_answers_later_requests(env, headers):
    spec = {"target": "cpu-ort", "objective": "energy"}
    first = env.submit(headers, spec=spec).json()["job_id"]
    env.finish(first, artifacts={"bundle.zip": b"PK-old"})
    refreshed = env.submit(headers, spec={**spec, "cache": "refresh"}).json()
    assert refreshed["cached"] is False and refreshed["status"] == "queued"
    assert refreshed["job_id"] in env.enqueued
    env.finish(refreshed["job_id"], artifacts={"bundle.zip": b"PK-new"})
    # The refreshed run is the newest original: an ordinary resubmission now gets its artifacts.
    later = env.submit(headers, spec=spec).json()
    assert later["cached"] is True and env.job(later["job_id"]).cached_from_job_id == refreshed["job_id"]
    wrong = env.submit(headers, spec={**spec, "cache": "never"})
    assert wrong.status_code == 422 and "cache" in json.dumps(wrong.json())


def test_get_job_reports_state_progress_and_timings(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    queued = env.client.get(f"/jobs/{job_id}", headers=headers).json()
    assert queued["status"] == "queued" and queued["progress_percent"] == 0 and queued["run_seconds"] is None
    assert queued["links"]["artifacts"] == f"/jobs/{job_id}/artifacts"
    env.finish(job_id, report={"nodes_after": 2})
    done = env.client.get(f"/jobs/{job_id}", headers=headers).json()
    assert done["status"] == "succeeded" and done["progress_percent"] == 100.0
    assert done["report_summary"] == {"nodes_after": 2} and done["run_seconds"] >= 0


def test_list_jobs_filters_and_paginates(env, headers):
    ids = [env.submit(headers, model=tiny_onnx(0.01 * i)).json()["job_id"] for i in range(5)]
    env.finish(ids[0])
    page = env.client.get("/jobs?limit=2", headers=headers).json()
    assert page["total"] == 5 and [j["id"] for j in page["items"]] == ids[::-1][:2]
    seen, cursor = [], None
    while True:
        url = "/jobs?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = env.client.get(url, headers=headers).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]
    offset_page = env.client.get("/jobs?limit=2&offset=4", headers=headers).json()
    assert [j["id"] for j in offset_page["items"]] == [ids[0]]
    succeeded = env.client.get("/jobs?status=succeeded", headers=headers).json()
    assert [j["id"] for j in succeeded["items"]] == [ids[0]]
    assert env.client.get("/jobs?target=nvidia-orin-nano", headers=headers).json()["total"] == 0
    bad = env.client.get("/jobs?status=exploded", headers=headers)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    assert env.client.get("/jobs?cursor=garbage", headers=headers).json()["error"]["code"] == "invalid_cursor"


def test_cancel_queued_job_at_once(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    response = env.client.delete(f"/jobs/{job_id}", headers=headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    job = env.job(job_id)
    assert job.status == "cancelled" and job.finished_at is not None and job.error["code"] == "cancelled"
    assert [e.kind for e in job.events] == ["queued", "cancelled"]


def test_cancel_running_job_asks_the_worker(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    with env.sessions() as session:
        session.get(Job, job_id).status = "running"
        session.commit()
    response = env.client.delete(f"/jobs/{job_id}", headers=headers)
    assert response.status_code == 202 and response.json()["cancel_requested"] is True
    assert env.job(job_id).status == "running"


def test_cancel_finished_job_is_409(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    env.finish(job_id)
    response = env.client.delete(f"/jobs/{job_id}", headers=headers)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "job_finished"
    assert env.client.delete(f"/jobs/{job_id}", headers=headers).status_code == 409


def test_artifacts_list_and_download(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    env.finish(job_id, artifacts={"bundle.zip": b"zipzip", "report.json": b"{}"})
    listing = env.client.get(f"/jobs/{job_id}/artifacts", headers=headers).json()
    assert [(a["name"], a["size"]) for a in listing["items"]] == [("bundle.zip", 6), ("report.json", 2)]
    assert listing["items"][0]["url"] == f"/jobs/{job_id}/artifacts/bundle.zip"
    download = env.client.get(listing["items"][0]["url"], headers=headers)
    assert download.status_code == 200 and download.content == b"zipzip"
    assert download.headers["content-type"] == "application/zip"
    assert 'filename="bundle.zip"' in download.headers["content-disposition"]
    missing = env.client.get(f"/jobs/{job_id}/artifacts/nope.bin", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "artifact_not_found"


def _read_sse(response) -> list[tuple[str, dict]]:
    events, name = [], "message"
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            events.append((name, json.loads(line.split(":", 1)[1].strip())))
            name = "message"
    return events


def test_events_replay_and_end_for_finished_job(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    env.finish(job_id)
    with env.client.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _read_sse(response)
    assert [name for name, _ in events] == ["queued", "succeeded", "end"]
    assert events[-1][1]["status"] == "succeeded"


def test_events_follow_a_running_job_until_it_ends(env, headers, monkeypatch):
    """The stream follows the job to its end; with Redis each wait ends on the worker's published nudge, never
    on the fallback re-read (seen at the subscription, not timed). How soon an event reaches the client, with
    nudges and by polling, is measured by ``python -m bench.mechanics`` (progress stream)."""
    from service.jobs import routes as jobs_api
    from service.jobs import service as jobs

    first_read_done, wakes = threading.Event(), []
    real_events_since, real_subscribe = jobs_api._events_since, jobs_api._subscribe

    def events_since(*args, **kwargs):
        answer = real_events_since(*args, **kwargs)
        first_read_done.set()
        return answer

    async def subscribe(*args, **kwargs):
        client, pubsub = await real_subscribe(*args, **kwargs)
        real_get_message = pubsub.get_message

        async def get_message(*args, ignore_subscribe_messages=False, **kwargs):
            message = await real_get_message(*args, ignore_subscribe_messages=False, **kwargs)
            # None: the wait ran into the fallback re-read's timeout; else what ended it (a nudge is a
            # 'message', the subscription's confirmation a 'subscribe', which the stream asks to ignore).
            wakes.append("timeout" if message is None else message["type"])
            if message is not None and message["type"] != "message" and ignore_subscribe_messages:
                return None
            return message

        pubsub.get_message = get_message
        return client, pubsub

    monkeypatch.setattr(jobs_api, "_events_since", events_since)
    monkeypatch.setattr(jobs_api, "_subscribe", subscribe)
    job_id = env.submit(headers).json()["job_id"]

    def worker():
        assert first_read_done.wait(60)  # a hang guard; from here on the stream has to wait for what follows
        with env.sessions() as session:
            job = session.get(Job, job_id)
            job.status, job.stage, job.progress = "running", "fusion", 0.5
            job.record("progress", "fusing")
            session.commit()
            jobs.publish(env.app.state.redis, job, "progress")
        time.sleep(0.5)
        env.finish(job_id)
        with env.sessions() as session:
            jobs.publish(env.app.state.redis, session.get(Job, job_id), "succeeded")

    thread = threading.Thread(target=worker)
    thread.start()
    with env.client.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
        events = _read_sse(response)
    thread.join()
    assert [name for name, _ in events] == ["queued", "progress", "succeeded", "end"]
    assert events[1][1]["stage"] == "fusion" and events[1][1]["progress"] == 0.5
    if env.settings.redis_url:
        assert "message" in wakes and "timeout" not in wakes, wakes  # woken by nudges, never by the timeout
    else:
        assert wakes == []  # no Redis: the stream re-reads the database at its poll interval


def test_events_resume_after_last_event_id(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    env.finish(job_id)
    with env.sessions() as session:
        first_id = session.scalar(select(func.min(JobEvent.id)).where(JobEvent.job_id == job_id))
    with env.client.stream(
        "GET", f"/jobs/{job_id}/events", headers={**headers, "Last-Event-ID": str(first_id)}
    ) as response:
        events = _read_sse(response)
    assert [name for name, _ in events] == ["succeeded", "end"]


def test_artifact_rows_copied_not_blobs(env, headers):
    spec = {"target": "cpu-ort", "seed": 7}
    first = env.submit(headers, spec=spec).json()["job_id"]
    env.finish(first, artifacts={"model.onnx": b"optimised"})
    cached = env.submit(headers, spec=spec).json()["job_id"]
    with env.sessions() as session:
        rows = session.scalars(select(Artifact).where(Artifact.job_id.in_([first, cached]))).all()
    assert len(rows) == 2 and len({r.blob_key for r in rows}) == 1
