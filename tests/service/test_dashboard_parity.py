"""The dashboard's upload form does what the API does (issue 35), in headless Chromium against a real embedded
server: it starts on cpu-ort with no empty band above its first row; choosing an int8-only target (alone, among
those compared, or through "all targets") offers synthetic calibration with its warning, and a group of every
target with it succeeds, the kv260 job's page showing the warning; a job page shows its requirements and the
comparison with the previous job of its model; a speed-up of 1.00x is never shown in green."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from service.dashboard.pages import _speed_tone
from tests.service.conftest import tiny_onnx
from tests.service.live import JOB_TIMEOUT_S, embedded_server, wait_for_job
from tests.service.test_dashboard import SHOTS, browser, page  # noqa: F401 - the shared browser fixtures

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    data = tmp_path_factory.mktemp("dashboard-parity")
    with embedded_server(data, toolchains_dir=str(data / "no-toolchains")) as server:
        yield server


def _wait_for_group(url: str, group_id: str) -> dict:
    deadline = time.monotonic() + JOB_TIMEOUT_S * 3
    while True:
        group = httpx.get(f"{url}/groups/{group_id}", timeout=10).json()
        if group["status"] not in ("queued", "running"):
            return group
        assert time.monotonic() < deadline, f"group {group_id} still {group['status']}"
        time.sleep(0.5)


def test_the_form_starts_on_cpu_ort_without_an_empty_band(page, live):  # noqa: F811
    page.goto("/")
    form = page.locator("#upload-form")
    assert form.locator("select[name=target]").input_value() == "cpu-ort"
    heading = page.locator("section.card h2").first.bounding_box()
    first_row = [form.locator(f"{kind}[name={name}]").bounding_box()
                 for kind, name in (("input", "model"), ("select", "target"), ("select", "objective"),
                                    ("select", "precision"))]  # fmt: skip
    # The first row's controls sit right under the heading, side by side.
    assert first_row[0]["y"] - (heading["y"] + heading["height"]) < 60, (heading, first_row[0])
    assert max(box["y"] for box in first_row) - min(box["y"] for box in first_row) < 8, first_row
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-form.png"))


def test_a_group_of_every_target_with_synthetic_calibration_succeeds_with_its_warning(page, live, tmp_path):  # noqa: F811
    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_onnx(0.31))
    page.goto("/")
    form = page.locator("#upload-form")
    box = page.locator("#synthetic-calibration")
    assert box.is_hidden()  # cpu-ort quantises nothing it was not asked to
    form.locator("select[name=target]").select_option("xilinx-kv260")
    assert box.is_visible()
    form.locator("select[name=target]").select_option("cpu-ort")
    assert box.is_hidden()

    form.locator("input[name=model]").set_input_files(str(model))
    form.locator("input[name=targets][value=all]").check()
    assert box.is_visible() and "no accuracy claim" in box.inner_text()
    form.locator("button[type=submit]").click()  # without the box: the API's refusal, on the form
    message = page.locator("#upload-message")
    message.filter(has_text="computes int8 only").wait_for(timeout=30_000)
    assert "allow-synthetic-calibration" in message.inner_text()

    box.locator("input[name=allow_synthetic_calibration]").check()
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-synthetic.png"), full_page=True)
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r"/ui/groups/[0-9a-f-]{36}$"), timeout=60_000)
    group_id = page.url.rsplit("/", 1)[1]
    group = _wait_for_group(live.url, group_id)
    assert group["status"] == "succeeded", group["comparison"]
    # The group page reloads itself every few seconds while jobs run (CI once saw that reload cut this
    # navigation short): once it shows the finished group it schedules no more reloads.
    page.wait_for_selector("#group[data-status=succeeded]", timeout=30_000)
    kv260 = next(job for job in group["jobs"] if job["target"] == "xilinx-kv260")
    assert httpx.get(f"{live.url}/jobs/{kv260['job_id']}", timeout=10).json()["spec"]["allow_synthetic_calibration"]
    page.goto(f"/ui/jobs/{kv260['job_id']}")
    assert "quantised on seeded random inputs" in page.locator("#warnings").inner_text()


def test_a_job_page_shows_its_requirements_and_its_predecessor(page, live):  # noqa: F811
    spec = {"target": "cpu-ort", "model_name": "page-gate", "measure_latency": False,
            "requirements": ["cpu_nodes==0", "accuracy>=0.99", "no_regression"]}  # fmt: skip
    ids = []
    for alpha in (0.41, 0.42):
        created = httpx.post(f"{live.url}/optimize", files={"model": ("m.onnx", tiny_onnx(alpha))},
                             data={"spec": json.dumps(spec)}, timeout=60).json()  # fmt: skip
        assert wait_for_job(live.url, created["job_id"])["status"] == "succeeded"
        ids.append(created["job_id"])
    page.goto(f"/ui/jobs/{ids[1]}")
    assert page.locator("[data-field=model-name]").inner_text() == "page-gate"
    rows = page.locator("#gates table.requirements tbody tr")
    assert rows.count() == 3
    verdicts = {rows.nth(i).locator("td.mono").inner_text(): rows.nth(i).get_attribute("data-met") for i in range(3)}
    assert verdicts == {"cpu_nodes==0": "true", "accuracy>=0.99": "false", "no_regression": "true"}
    assert "no accuracy claim" in page.locator("#gates").inner_text()
    assert ids[0][:8] in page.locator("#previous + p").inner_text()
    assert page.locator("#gates table.previous tr[data-figure=bundle_mb]").count() == 1
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-gates.png"), full_page=True)


@pytest.mark.parametrize(
    ("headline", "tone"),
    [({"speedup": 1.003, "verdict": "faster"}, ""), ({"speedup": 1.0, "verdict": None}, ""),
     ({"speedup": 0.998, "verdict": None}, ""), ({"speedup": 1.25, "verdict": "faster"}, "ok-text"),
     ({"speedup": 1.3, "verdict": None}, "ok-text"), ({"speedup": 0.8, "verdict": "slower"}, "warn-text"),
     ({"speedup": 1.4, "verdict": "no significant difference"}, "")],
)  # fmt: skip
def test_only_a_speed_up_that_reads_faster_is_green(headline, tone):
    assert _speed_tone(headline) == tone
