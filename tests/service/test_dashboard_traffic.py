"""The job page's traffic section in headless Chromium (Playwright), against a real embedded server: the
traffic a deployed runtime pushed drawn against the buckets, the padding waste, the proposal with its gain,
the "Re-specialise" button making version 2 (whose page shows the lineage), and the waste threshold form;
every request the pages make stays on the server (no CDN).

Screenshots go to the system temp folder (``flexdsa-dashboard-traffic-*.png``)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest

from flexdsa_runtime import Runtime
from flexdsa_runtime.service_client import download_bundle, push_traffic
from tests.runtime.tiny_models import MASKED, model_bytes
from tests.service.live import embedded_server, wait_for_job
from tests.service.test_dashboard import CHROMIUM, CHROMIUM_ARGS, SHOTS

pytestmark = pytest.mark.browser

SPEC = {"target": "rockchip-rk3588", "shape_buckets": {"batch": [1], "seq": [48]}, "measure_latency": False}
LENGTHS = {3: 30, 5: 40, 8: 25, 13: 10, 24: 4, 48: 1}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server, a job, and the traffic of a runtime that served LENGTHS with its bundle."""
    data = tmp_path_factory.mktemp("traffic-dashboard")
    (data / "no-toolchains").mkdir()
    with embedded_server(data, toolchains_dir=str(data / "no-toolchains")) as server:
        job_id = httpx.post(
            f"{server.url}/optimize",
            files={"model": ("masked.onnx", model_bytes(MASKED))},
            data={"spec": json.dumps(SPEC)},
        ).json()["job_id"]
        assert wait_for_job(server.url, job_id)["status"] == "succeeded"
        rng = np.random.default_rng(0)
        with Runtime.open(download_bundle(server.url, job_id, data / "bundle.zip")) as runtime:
            for seq, count in LENGTHS.items():
                for _ in range(count):
                    x = rng.standard_normal((1, seq, 4)).astype(np.float32)
                    runtime.run({"x": x, "attention_mask": np.ones((1, seq), np.int64)})
            push_traffic(server.url, job_id, runtime.traffic.snapshot())
        yield server, job_id


@pytest.fixture
def page(served):
    from playwright.sync_api import sync_playwright

    server, _ = served
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=server.url, viewport={"width": 1400, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        elsewhere: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        host = urlparse(server.url).netloc
        page.on(
            "request", lambda r: elsewhere.append(r.url) if urlparse(r.url).netloc not in (host, "") else None
        )
        yield page
        browser.close()
        assert not errors, f"JavaScript errors: {errors}"
        assert not elsewhere, f"requests off the server: {elsewhere}"


def test_traffic_against_the_buckets_and_re_specialising_from_the_page(page, served):
    server, job_id = served
    page.goto(f"/ui/jobs/{job_id}")
    section = page.locator("#traffic")
    assert section.locator("#traffic-requests").inner_text() == str(sum(LENGTHS.values()))
    waste = float(section.locator("#traffic-waste").inner_text().rstrip("%"))
    assert waste > 100  # most requests are far shorter than the one seq-48 bucket
    chart = section.locator("svg.traffic-chart[data-dim=seq]")
    assert chart.locator("rect.bar").count() == len(LENGTHS)
    assert {chart.locator("rect.bar").nth(i).get_attribute("data-value") for i in range(len(LENGTHS))} == {
        str(v) for v in LENGTHS
    }
    assert [chart.locator("line.bucket-line").nth(0).get_attribute("data-value")] == ["48"]
    proposed = [int(line.get_attribute("data-value")) for line in chart.locator("line.proposed-line").all()]
    assert proposed[-1] == 48 and len(proposed) > 1 and min(proposed) < 13
    rows = section.locator("table.proposal tbody tr")
    assert rows.count() == 3 and "[48]" in rows.nth(0).inner_text() and "[128]" in rows.nth(1).inner_text()
    assert re.search(r"Expected cost, proposed / this bundle's: 0\.\d\d×", section.locator("#proposal-gain").inner_text())
    # Every request fits the one bucket: this bundle costs, per request, the job's own figure for it.
    figure = httpx.get(f"{server.url}/jobs/{job_id}").json()["report_summary"]["figures"]["latency"]
    assert rows.nth(0).locator("[data-field=expected-cost]").inner_text() == figure["text"]
    assert section.locator("table.versions tbody tr").count() == 1
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-traffic-v1.png"), full_page=True)
    section.screenshot(path=str(SHOTS / "flexdsa-dashboard-traffic-section.png"))

    page.locator("#respecialise").click()
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"))
    child_id = page.locator("#job").get_attribute("data-job-id")
    assert child_id != job_id
    child = wait_for_job(server.url, child_id)
    assert child["status"] == "succeeded" and child["parent_job_id"] == job_id
    assert child["spec"]["shape_buckets"]["seq"] == proposed
    # The page reloads itself when the job ends (the server renders the finished job); navigating to it
    # meanwhile raced that reload (ERR_ABORTED): wait for the page as the server renders it once finished.
    page.wait_for_selector('#job[data-status="succeeded"]', timeout=30_000)
    versions = page.locator("#traffic table.versions tbody tr")
    assert versions.count() == 2
    assert (
        versions.nth(0).get_attribute("data-version") == "1"
        and versions.nth(1).get_attribute("data-version") == "2"
    )
    assert job_id[:8] in versions.nth(1).inner_text()  # re-specialised from version 1
    assert "this job" in versions.nth(1).inner_text()
    assert page.locator("#no-traffic").is_visible()  # version 2 has served nothing yet
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-traffic-v2.png"), full_page=True)


def test_the_waste_threshold_form(page, served):
    server, job_id = served
    page.goto(f"/ui/jobs/{job_id}")
    form = page.locator("#traffic-policy")
    form.locator("input[name=waste_percent]").fill("25")
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(rf"/ui/jobs/{job_id}"))
    assert "on: 25%" in page.locator("#traffic-policy").inner_text()
    assert httpx.get(f"{server.url}/jobs/{job_id}").status_code == 200
    page.locator("#traffic-policy input[name=waste_percent]").fill("a lot")
    page.locator("#traffic-policy button[type=submit]").click()
    assert "is not a percentage" in page.locator("#traffic-error").inner_text()
