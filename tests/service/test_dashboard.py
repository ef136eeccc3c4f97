"""The dashboard in headless Chromium (Playwright) against a real uvicorn server in embedded mode: upload a
model through the form, watch the job finish on its page, read the report, download artifacts; failed jobs,
the status filter, the job list updating live, reading with JavaScript off, and the key login.

Screenshots of the pages go to the system temp folder (``flexdsa-dashboard-*.png``) for a human to look at.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest

from tests.service.conftest import tiny_onnx
from tests.service.live import (
    BERT,
    JOB_TIMEOUT_S,
    REPO,
    LiveServer,
    embedded_server,
    failing_onnx,
    wait_for_job,
)

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
JOB_TIMEOUT_MS = JOB_TIMEOUT_S * 1000
SHOTS = Path(tempfile.gettempdir())


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveServer]:
    # Each pipeline stage lasts at least this long (workers/child.py), so a test can see a job mid-run.
    with embedded_server(tmp_path_factory.mktemp("dashboard"), test_stage_delay_s="0.4") as server:
        yield server


@pytest.fixture
def page(browser, live):
    context = browser.new_context(
        base_url=live.url, viewport={"width": 1400, "height": 900}, accept_downloads=True
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def submit(url: str, model: bytes, spec: dict | None = None, headers: dict | None = None) -> str:
    response = httpx.post(
        f"{url}/optimize",
        files={"model": ("model.onnx", model)},
        data={"spec": json.dumps(spec or {"target": "cpu-ort"})},
        headers=headers or {},
        timeout=60,
    )
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def test_upload_watch_report_and_download(page, live):
    page.goto("/")
    form = page.locator("#upload-form")
    form.locator("input[name=model]").set_input_files(str(BERT))
    form.locator("select[name=target]").select_option("cpu-ort")
    form.locator("select[name=objective]").select_option("latency")
    page.locator("details.rules summary").click()
    form.locator("input[name=disabled_rules][value=skip_layer_norm]").check()
    form.locator("button[type=submit]").click()

    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"))
    job_id = page.locator("#job").get_attribute("data-job-id")
    # The page follows the job live: status, stage, progress bar and event rows change under the script.
    page.wait_for_function(
        """() => {
            const job = document.querySelector('#job');
            const bar = job.querySelector('[data-field=progress]');
            return job.dataset.status === 'running' && Number(bar.getAttribute('aria-valuenow')) > 0
                && job.querySelector('[data-field=stage]').textContent !== '–'
                && document.querySelectorAll('#events tr').length > 2;
        }""",
        timeout=JOB_TIMEOUT_MS,
    )
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-running.png"))
    # ... and reloads itself once the job ends, to show the report: no reload from the test.
    page.wait_for_selector("#job[data-status=succeeded]", timeout=JOB_TIMEOUT_MS)
    job = httpx.get(f"{live.url}/jobs/{job_id}").json()
    assert job["spec"]["disabled_rules"] == ["skip_layer_norm"] and job["spec"]["objective"] == "latency"

    report = page.locator("#report")
    assert "344 →" in report.locator(".tile").first.inner_text()  # nodes before -> after
    assert report.get_by_text("passed", exact=True).is_visible()
    ops = page.locator("table.ops tbody tr")
    assert ops.count() > 5 and page.locator("table.ops tr.changed").count() > 0
    fusions = page.locator("table.fusions tbody tr")
    assert fusions.count() > 0
    assert page.locator("table.fusions .badge", has_text="taken").count() > 0
    assert page.locator("table.fusions td.reason").first.inner_text().strip()  # every decision gives a reason
    assert "skip_layer_norm" in page.locator("#report").inner_text()  # named as switched off
    assert page.locator("#estimates .badge.estimate").is_visible()  # estimates are labelled as such
    assert "×" in page.locator("#latency + p").inner_text()  # measured ORT CPU speed-up
    assert page.locator("#validation + table tbody tr").count() == 2  # bert's two outputs
    assert page.locator("#memory + table tbody tr").count() >= 1
    graphs = page.locator("#graphs svg.graph")
    assert graphs.count() == 2
    assert graphs.nth(0).locator("g.op").count() > graphs.nth(1).locator("g.op").count() > 0
    assert page.locator("#events tr").filter(has_text="succeeded").count() == 1

    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-job.png"), full_page=True)

    with page.expect_download() as download:
        page.locator("#artifacts a", has_text="model.onnx").click()
    model = onnx.load_model_from_string(Path(download.value.path()).read_bytes())
    onnx.checker.check_model(model)
    assert len(model.graph.node) == job["report_summary"]["nodes_after"]
    with page.expect_download() as download:
        page.locator("#artifacts a", has_text="report.json").click()
    assert json.loads(Path(download.value.path()).read_bytes())["nodes"]["total_before"] == 344

    page.goto("/")
    row = page.locator(f"tr[data-job-id='{job_id}']")
    assert row.locator("[data-field=status]").inner_text() == "succeeded"
    assert "344 →" in row.inner_text()
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-jobs.png"), full_page=True)


def test_failed_job_shows_its_error_code_and_message(page, live):
    job_id = submit(live.url, failing_onnx())
    page.goto(f"/ui/jobs/{job_id}")
    page.wait_for_selector("#job[data-status=failed]", timeout=JOB_TIMEOUT_MS)
    error = page.locator("#job-error")
    assert error.locator("h2").inner_text() == "Failed: unsupported_model"
    assert "acme.custom" in error.locator(".error-message").inner_text()
    assert page.locator("#report").count() == 0
    page.screenshot(path=str(SHOTS / "flexdsa-dashboard-failed.png"), full_page=True)


def test_job_list_follows_new_and_finishing_jobs_live(page, live):
    page.goto("/")
    job_id = submit(live.url, failing_onnx())  # submitted elsewhere while the page is open
    row = page.locator(f"tr[data-job-id='{job_id}']")
    row.wait_for(timeout=15_000)
    row.locator("[data-field=status]", has_text="failed").wait_for(timeout=JOB_TIMEOUT_MS)
    assert "unsupported_model" in row.inner_text()


def test_status_filter_lists_only_that_status(page, live):
    failed = submit(live.url, failing_onnx())
    succeeded = submit(live.url, tiny_onnx(0.3), {"target": "cpu-ort", "measure_latency": False})
    wait_for_job(live.url, failed)
    wait_for_job(live.url, succeeded)
    page.goto("/?status=failed")
    statuses = page.locator("#job-table tbody [data-field=status]").all_inner_texts()
    assert statuses and set(statuses) == {"failed"}
    assert page.locator(f"tr[data-job-id='{failed}']").count() == 1
    assert page.locator(f"tr[data-job-id='{succeeded}']").count() == 0
    assert page.locator(".filters a.current").inner_text() == "failed"


def test_pages_read_with_javascript_off(browser, live):
    job_id = submit(live.url, tiny_onnx(0.2), {"target": "cpu-ort", "measure_latency": False})
    wait_for_job(live.url, job_id)
    context = browser.new_context(base_url=live.url, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"/ui/jobs/{job_id}")
        assert page.locator("#job").get_attribute("data-status") == "succeeded"
        assert page.locator("#report").is_visible()
        assert "Not measured" in page.locator("#latency + p").inner_text()
        assert page.locator("#artifacts a", has_text="model.onnx").is_visible()
        page.goto("/")
        assert page.locator(f"tr[data-job-id='{job_id}']").is_visible()
        assert "needs JavaScript" in page.locator("noscript").first.inner_text()
    finally:
        context.close()


def test_unknown_job_answers_a_404_page(page, live):
    response = page.goto("/ui/jobs/00000000-0000-0000-0000-000000000000")
    assert response.status == 404
    assert page.locator("h1").inner_text() == "No such job"


# --- distributed-style auth: keys required -------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    data_dir = tmp_path_factory.mktemp("dashboard-keys")
    keys = {tenant: _create_key(data_dir, tenant) for tenant in ("acme", "globex")}
    with embedded_server(data_dir, auth="required") as server:
        yield server, keys


def _create_key(data_dir: Path, tenant: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    env.update(FLEXDSA_DATA_DIR=str(data_dir), FLEXDSA_AUTH="required")
    result = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "keys", "create", "--tenant", tenant],
        capture_output=True, text=True, cwd=REPO, env=env, check=True, timeout=120,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def test_login_sets_an_httponly_cookie_and_scopes_jobs_to_the_tenant(browser, keyed):
    server, keys = keyed
    theirs = submit(server.url, failing_onnx(), headers={"X-API-Key": keys["globex"]})
    context = browser.new_context(base_url=server.url)
    try:
        page = context.new_page()
        page.goto("/")
        assert page.url.endswith("/ui/login?next=/")  # no key yet: the login page, not a JSON 401
        page.fill("input[name=api_key]", "fdsa_not_a_real_key")
        page.click("form.login button")
        assert "not valid" in page.locator("#login-error").inner_text()
        assert not context.cookies()

        page.fill("input[name=api_key]", keys["acme"])
        page.click("form.login button")
        page.wait_for_url(re.compile(r"/$"))
        assert page.locator(".tenant b").inner_text() == "acme"
        (cookie,) = context.cookies()
        assert cookie["name"] == "flexdsa_key" and cookie["httpOnly"] and cookie["sameSite"] == "Lax"

        # The cookie carries the tenant for the script's API calls too: upload through the form.
        page.locator("#upload-form input[name=model]").set_input_files(
            {"name": "leaky.onnx", "mimeType": "application/octet-stream", "buffer": tiny_onnx(0.4)}
        )
        page.locator("#upload-form input[name=measure_latency]").uncheck()
        page.locator("#upload-form button[type=submit]").click()
        page.wait_for_selector("#job[data-status=succeeded]", timeout=JOB_TIMEOUT_MS)
        mine = page.locator("#job").get_attribute("data-job-id")
        job = httpx.get(f"{server.url}/jobs/{mine}", headers={"X-API-Key": keys["acme"]}).json()
        assert job["model_filename"] == "leaky.onnx"

        response = page.goto(f"/ui/jobs/{theirs}")  # another tenant's job reads as missing
        assert response.status == 404
        page.goto("/")
        assert page.locator(f"tr[data-job-id='{theirs}']").count() == 0
        assert page.locator(f"tr[data-job-id='{mine}']").count() == 1

        page.click("header form button")  # log out
        page.wait_for_url(re.compile(r"/ui/login$"))
        assert not context.cookies()
    finally:
        context.close()


def test_cancel_button_stops_a_job(page, live):
    job_id = submit(live.url, BERT.read_bytes(), {"target": "cpu-ort", "seed": 7})  # not in the job cache
    page.goto(f"/ui/jobs/{job_id}")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("#cancel-job").click()
    page.wait_for_selector("#job[data-status=cancelled]", timeout=JOB_TIMEOUT_MS)
    assert page.locator("#job-error h2").inner_text().startswith("Cancelled")
    assert page.locator("#cancel-job").count() == 0


# --- operators: incidents ------------------------------------------------------------------------------

OPERATOR_TOKEN = "operator-token-for-the-dashboard-tests"


@pytest.fixture(scope="module")
def operated(tmp_path_factory) -> Iterator[tuple[LiveServer, str]]:
    """Keys required, an operator token, and the stand-in optimizer (whose BUG_GRAPH model is a bug in the
    compiler: an internal error with an incident)."""
    data_dir = tmp_path_factory.mktemp("dashboard-operators")
    key = _create_key(data_dir, "initech")
    settings = {"auth": "required", "operator_token": OPERATOR_TOKEN,
                "test_optimizer": "tests.workers.standin:StandInOptimizer"}  # fmt: skip
    with embedded_server(data_dir, **settings) as server:
        yield server, key


def _bug_model() -> bytes:
    from tests.workers.standin import BUG_GRAPH

    model = onnx.load_model_from_string(tiny_onnx(0.7))
    model.graph.name = BUG_GRAPH
    return model.SerializeToString()


def test_incident_is_quoted_to_the_tenant_and_shown_to_the_operator(browser, operated):
    server, key = operated
    job_id = submit(server.url, _bug_model(), headers={"X-API-Key": key})
    job = wait_for_job(server.url, job_id, headers={"X-API-Key": key})
    assert job["error"]["code"] == "internal_error", job
    incident = job["error"]["details"]["incident"]

    tenant = browser.new_context(base_url=server.url)
    try:
        page = tenant.new_page()
        page.goto(f"/ui/login?next=/ui/jobs/{job_id}")
        page.fill("input[name=api_key]", key)
        page.click("form.login button")
        page.wait_for_selector("#job[data-status=failed]")
        quoted = page.locator("#job-incident")
        assert incident in quoted.inner_text() and "quote this id" in quoted.inner_text()
        assert quoted.locator("a").count() == 0  # no link to a page the tenant cannot open
        assert "deliberate bug" not in page.content() and "Traceback" not in page.content()
        assert page.locator("#nav-incidents").count() == 0
        page.screenshot(path=str(SHOTS / "flexdsa-dashboard-incident-tenant.png"), full_page=True)
        for path in (f"/ui/incidents/{incident}", "/ui/incidents"):
            response = page.goto(path)
            assert response.status == 404 and "deliberate bug" not in page.content()
    finally:
        tenant.close()

    operator = browser.new_context(base_url=server.url)
    try:
        page = operator.new_page()
        assert page.goto("/ui/incidents").status == 404  # no token yet
        page.goto("/ui/operator")
        page.fill("input[name=token]", "not-the-operator-token-at-all")
        page.click("form.login button")
        assert "not the operator token" in page.locator("#login-error").inner_text()
        page.fill("input[name=token]", OPERATOR_TOKEN)
        page.click("form.login button")
        page.wait_for_url(re.compile(r"/ui/incidents$"))
        (cookie,) = operator.cookies()
        assert cookie["name"] == "flexdsa_operator" and cookie["httpOnly"] and cookie["path"] == "/ui/"
        row = page.locator(f"tr[data-incident-id='{incident}']")
        assert "internal_error" in row.inner_text() and job_id in row.inner_text()
        row.locator("a").click()
        page.wait_for_url(re.compile(f"/ui/incidents/{incident}$"))
        assert "RuntimeError: deliberate bug in the stand-in optimizer" in page.locator("#traceback").inner_text()
        assert job_id in page.locator("[data-field=job]").inner_text()
        assert "initech" in page.locator("[data-field=tenant]").inner_text()
        assert "UTC" in page.locator("[data-field=created]").inner_text()
        page.screenshot(path=str(SHOTS / "flexdsa-dashboard-incident-operator.png"), full_page=True)
    finally:
        operator.close()


def test_login_posted_from_another_site_is_refused(keyed):
    server, keys = keyed
    response = httpx.post(
        f"{server.url}/ui/login",
        data={"api_key": keys["acme"], "next": "/"},
        headers={"Origin": "https://evil.example"},
    )
    assert response.status_code == 403
    assert "flexdsa_key" not in response.cookies


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory, s3_server) -> Iterator[LiveServer]:
    """The embedded server with its artifacts in a radosgw bucket (presigned downloads)."""
    saved = {name: os.environ.get(name) for name in s3_server.env()}
    os.environ.update(s3_server.env())  # boto3's chain, read by the server process it starts
    try:
        store = s3_server.settings()
        with embedded_server(
            tmp_path_factory.mktemp("dashboard-s3"), artifact_url=store["artifact_url"],
            s3_endpoint_url=store["s3_endpoint_url"], test_optimizer="tests.workers.standin:StandInOptimizer",
        ) as server:  # fmt: skip
            yield server
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_dashboard_downloads_follow_the_redirect_to_the_object_store(browser, on_s3):
    import hashlib

    job_id = submit(on_s3.url, tiny_onnx(0.61))
    job = wait_for_job(on_s3.url, job_id)
    assert job["status"] == "succeeded", job["error"]
    items = {a["name"]: a for a in httpx.get(f"{on_s3.url}/jobs/{job_id}/artifacts").json()["items"]}
    context = browser.new_context(base_url=on_s3.url, accept_downloads=True)
    try:
        page = context.new_page()
        page.goto(f"/ui/jobs/{job_id}")
        for name in ("model.onnx", "report.json"):
            with page.expect_download() as download:
                page.locator("#artifacts a", has_text=name).click()
            assert download.value.url.startswith(on_s3.url.rsplit(":", 1)[0])
            assert "X-Amz-Signature=" in download.value.url  # fetched from the store, not through the API
            data = Path(download.value.path()).read_bytes()
            assert hashlib.sha256(data).hexdigest() == items[name]["sha256"]
    finally:
        context.close()


def _round_model() -> bytes:
    """Relu, Round, Add on [1, 16]: Round is not in the rk3588 op table, so one node falls back to the CPU."""
    graph = onnx.parser.parse_graph(
        "g (float[1, 16] x) => (float[1, 16] y) { a = Relu(x)\n b = Round(a)\n y = Add(b, a) }"
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@pytest.fixture(scope="module")
def broken_vendor(tmp_path_factory) -> Iterator[LiveServer]:
    """A server whose rockchip toolchain is installed (ready.json with the code's pins) but whose environment's
    python dies in the vendor's build with a Python traceback, as a broken vendor install does."""
    from flexdsa_core.toolchains import get_toolchain

    root = tmp_path_factory.mktemp("toolchains")
    toolchain = get_toolchain("rockchip")
    python = toolchain.python(root)
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\nexec python3 -c 'def build():\n    raise RuntimeError(\"Unsupported op Foo in layer 3\")\nbuild()'\n"
    )
    python.chmod(0o755)
    (toolchain.home(root) / "ready.json").write_text(
        json.dumps({"requirements": [list(g) for g in toolchain.requirements], "versions": {"rknn-toolkit2": "x"}})
    )
    with embedded_server(tmp_path_factory.mktemp("dashboard-vendor"), toolchains_dir=str(root)) as server:
        yield server


def test_accelerator_job_page_colours_the_graph_tables_the_partition_and_one_lines_a_vendor_failure(
    browser, broken_vendor
):
    job_id = submit(broken_vendor.url, _round_model(), {"target": "rockchip-rk3588", "measure_latency": False})
    context = browser.new_context(base_url=broken_vendor.url, viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.goto(f"/ui/jobs/{job_id}")
        page.wait_for_selector("#job[data-status=succeeded]", timeout=JOB_TIMEOUT_MS)
        page.goto(f"/ui/jobs/{job_id}")  # the finished page, with its report (not the live one it reloads from)
        # The partition is a table (one row per bucket), never a key/value dump of the mapper's dict.
        assert page.locator("#partition + table tbody tr").count() == 1
        assert page.locator("dl.kv dt", has_text="accelerator_flop_share").count() == 0
        assert page.locator("dl.kv dt", has_text="placement").count() == 0
        # The optimised graph's nodes are coloured by device, with a legend.
        optimised = page.locator("#graphs svg.graph").nth(1)
        assert optimised.locator("g.on-cpu").count() == 1 and "Round" in optimised.locator("g.on-cpu").text_content()
        assert optimised.locator("g.on-accelerator").count() >= 1
        assert page.locator("#graph-legend .key.accelerator").is_visible()
        assert page.locator("#graph-legend .key.cpu").is_visible()
        # The vendor's failure: one line with the exception, its traceback only behind a toggle.
        failed = page.locator("#toolchain-failed").inner_text()
        assert "RuntimeError: Unsupported op Foo in layer 3" in failed and "Traceback" not in failed
        log = page.locator("#toolchain ~ details.more pre").first
        assert not log.is_visible()
        page.locator("#toolchain ~ details.more summary").first.click()
        assert log.is_visible() and "Traceback (most recent call last)" in log.inner_text()
        assert "Traceback" not in page.locator("#vendor ~ table").first.inner_text()  # the vendor-alone row too
        warnings = page.locator("#warnings").inner_text()
        assert "Unsupported op Foo" in warnings and "Traceback" not in warnings
        # The headline names its source; this machine's CPU is not the part.
        headline = page.locator("#headline").inner_text()
        assert "roofline estimate" in headline and "ONNX Runtime CPU (measured)" not in page.locator("#report .tiles").inner_text()
        page.screenshot(path=str(SHOTS / "flexdsa-dashboard-accelerator.png"), full_page=True)
        page.goto("/")  # the job list: the same headline with its source, no CPU timing
        cell = page.locator(f"tr[data-job-id='{job_id}'] [data-field=speedup]").inner_text()
        assert "roofline estimate" in cell and "×" in cell
        assert "CPU speed-up" not in page.locator("#job-table thead").inner_text()
    finally:
        context.close()


def test_the_upload_forms_refresh_box_runs_an_identical_job_again(page, live):
    model = tiny_onnx(0.77)
    first = submit(live.url, model, {"target": "cpu-ort", "measure_latency": False})
    wait_for_job(live.url, first)
    page.goto("/")
    form = page.locator("#upload-form")
    form.locator("input[name=model]").set_input_files(
        {"name": "model.onnx", "mimeType": "application/octet-stream", "buffer": model}
    )
    form.locator("input[name=measure_latency]").uncheck()
    form.locator("input[name=cache_refresh]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"))
    job_id = page.locator("#job").get_attribute("data-job-id")
    job = wait_for_job(live.url, job_id)
    assert job_id != first and job["spec"]["cache"] == "refresh" and job["cached_from_job_id"] is None


def test_the_upload_forms_precision_calibration_and_shape_buckets_reach_the_job(page, live, tmp_path):
    """A model that needs buckets or samples can be optimised from the page alone: a bucket the model cannot take
    is refused before queuing with the model's limit on the form, and precision with samples reaches the job."""
    import numpy as np

    page.goto("/")
    form = page.locator("#upload-form")
    form.locator("input[name=model]").set_input_files(str(REPO / "examples" / "tiny_bert.onnx"))
    form.locator("select[name=target]").select_option("rockchip-rk3588")
    form.locator("input[name=shape_buckets]").fill('{"batch": [1], "seq": [512]}')
    form.locator("button[type=submit]").click()
    message = page.locator("#upload-message.error")
    message.wait_for()
    assert "64" in message.inner_text(), message.inner_text()  # tiny_bert's position table: 64 rows
    form.locator("input[name=shape_buckets]").fill("{seq: 32")
    form.locator("button[type=submit]").click()
    page.wait_for_function("() => document.querySelector('#upload-message').textContent.includes('must be JSON')")

    samples = tmp_path / "samples.npz"
    # The one-node model's output is judged by top-1 (its look): samples whose first entry stands clear, so
    # int8's rounding cannot be expected to change the argmax of rows like them (``top1_expected``).
    rows = np.random.default_rng(0).standard_normal((9, 8)).astype(np.float32)
    rows[:, 0] += 8.0
    np.savez(samples, x=rows)
    form.locator("input[name=model]").set_input_files(
        {"name": "model.onnx", "mimeType": "application/octet-stream", "buffer": tiny_onnx(0.41)}
    )
    form.locator("select[name=target]").select_option("cpu-ort")
    form.locator("input[name=shape_buckets]").fill("")
    form.locator("select[name=precision]").select_option("int8")
    form.locator("input[name=calibration]").set_input_files(str(samples))
    form.locator("input[name=measure_latency]").uncheck()
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"))
    job_id = page.locator("#job").get_attribute("data-job-id")
    job = wait_for_job(live.url, job_id)
    assert job["status"] == "succeeded", job
    assert job["spec"]["precision"] == "int8"
    report = httpx.get(f"{live.url}/jobs/{job_id}/artifacts/report.json", follow_redirects=True).json()
    assert report["precision"]["calibration"] == {"source": "uploaded", "samples": 9, "input_shapes": {"x": [1, 8]}}


def test_an_int8_jobs_page_draws_each_layers_cosine_with_its_precision(page, live):
    """A mixed job's page charts every quantisable layer's cosine to the fp32 tensor on held-out samples, each
    bar coloured by the precision the layer shipped in, the same figures as report.json."""
    from tests.core.test_precision import _mlp_calibration, _sensitive_mlp

    response = httpx.post(
        f"{live.url}/optimize",
        files={"model": ("mlp.onnx", _sensitive_mlp()), "calibration": ("samples.npz", _mlp_calibration())},
        data={"spec": json.dumps({"target": "cpu-ort", "precision": "mixed", "measure_latency": False,
                                  "accuracy": {"top1_outputs": []}})},  # fmt: skip
        timeout=60,
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    assert wait_for_job(live.url, job_id)["status"] == "succeeded"
    report = httpx.get(f"{live.url}/jobs/{job_id}/artifacts/report.json", follow_redirects=True).json()
    rows = {r["layer"]: r for r in report["precision"]["layers"] if "cosine" in r}
    assert rows and report["precision"]["layer_cosines"]["on"] == "held-out samples"

    page.goto(f"/ui/jobs/{job_id}")
    bars = page.locator("#layers ~ figure svg.layer-chart g.layer")
    assert bars.count() == len(rows)
    for index in range(bars.count()):
        bar = bars.nth(index)
        row = rows[bar.get_attribute("data-layer")]
        assert bar.get_attribute("data-precision") == row["precision"]
        assert float(bar.get_attribute("data-cosine")) == row["cosine"]
        assert row["precision"] in bar.locator("title").text_content()
