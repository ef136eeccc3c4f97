"""Which chip? One upload compared on every target, end to end against a real embedded server (uvicorn, its
in-process worker, the real pipeline and whatever vendor toolchains are installed here): a transformer over
the API, a CNN through ``flexdsa submit --targets all``, the comparison page in headless Chromium, and the
upload form's several-target choice.

Screenshots go to the system temp folder (``flexdsa-compare-*.png``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from flexdsa_core import list_targets
from tests.service.conftest import tiny_onnx
from tests.service.live import BERT, JOB_TIMEOUT_S, REPO, embedded_server

MOBILENET = REPO / "tests" / "models" / "mobilenetv2.onnx"
ALL = [t.name for t in list_targets()]
# xilinx-kv260 computes int8 only: without samples it quantises on synthetic inputs (numerics only).
ALL_SPEC = {"targets": "all", "allow_synthetic_calibration": True}
GROUP_TIMEOUT_S = JOB_TIMEOUT_S * 3
SHOTS = Path(tempfile.gettempdir())
SOURCES = {"measured on this CPU", "roofline estimate", "not known"}

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with embedded_server(tmp_path_factory.mktemp("compare")) as server:
        yield server


def wait_for_group(url: str, group_id: str, timeout_s: float = GROUP_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        group = httpx.get(f"{url}/groups/{group_id}", timeout=10).json()
        if group["status"] not in ("queued", "running"):
            return group
        assert time.monotonic() < deadline, f"group {group_id} still {group['status']} after {timeout_s} s"
        time.sleep(0.5)


def check_rows(group: dict) -> None:
    """A succeeded row per target, each figure with its source."""
    rows = {row["target"]: row for row in group["comparison"]}
    assert sorted(rows) == sorted(ALL)
    failed = {name: row.get("error") for name, row in rows.items() if row["status"] != "succeeded"}
    assert not failed, failed
    for name, row in rows.items():
        assert row["latency"]["source"] in SOURCES and row["energy"]["source"] in SOURCES, name
        assert (row["latency"]["seconds"] is None) == (row["latency"]["source"] == "not known"), name
        assert row["accuracy"]["source"] != "not known" and row["accuracy"]["ok"] is not False, name
        assert 0 <= row["accelerator_flop_share"] <= 1 and row["cpu_fallback_nodes"] >= 0, name
        assert row["bundle_bytes"] > 0, name
    assert rows["cpu-ort"]["latency"]["source"] == "measured on this CPU"
    # Every accelerator's time is an estimate, never this machine's CPU timing.
    assert all(rows[n]["latency"]["source"] == "roofline estimate" for n in ALL if n != "cpu-ort")


@pytest.fixture(scope="module")
def transformer_group(live) -> str:
    response = httpx.post(
        f"{live.url}/optimize",
        files={"model": ("bert.onnx", BERT.read_bytes())},
        data={"spec": json.dumps(ALL_SPEC)},
        timeout=60,
    )
    assert response.status_code == 202, response.text
    created = response.json()
    assert sorted(job["target"] for job in created["jobs"]) == sorted(ALL)
    return created["group_id"]


def test_a_transformer_compared_on_every_target(live, transformer_group):
    group = wait_for_group(live.url, transformer_group)
    assert group["status"] == "succeeded", group
    check_rows(group)


def test_a_cnn_compared_on_every_target_from_the_cli(live, transformer_group, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"allow_synthetic_calibration": True}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    result = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "submit", str(MOBILENET), "--targets", "all", "--spec", str(spec),
         "--server", live.url, "--quiet"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=GROUP_TIMEOUT_S * 2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    group_id = lines[0].strip()
    assert lines[1].split()[:4] == ["target", "latency", "energy", "accuracy"]
    table = {line.split()[0]: line for line in lines[2:] if line.split() and line.split()[0] in ALL}
    assert sorted(table) == sorted(ALL)
    assert "[m]" in table["cpu-ort"] and all("[r]" in table[n] for n in ALL if n != "cpu-ort")
    group = httpx.get(f"{live.url}/groups/{group_id}", timeout=10).json()
    assert group["model_filename"] == "mobilenetv2.onnx"
    check_rows(group)


def test_an_unknown_target_is_refused_with_did_you_mean(live, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(tiny_onnx())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    result = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "submit", str(model), "--targets", "cpu-ort,rockchip-rk3589",
         "--server", live.url],
        capture_output=True, text=True, cwd=REPO, env={**env, "COLUMNS": "300"}, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "Did you mean 'rockchip-rk3588'" in result.stderr and "unknown_target" in result.stderr


# --- the page, in a real browser ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    from tests.service.test_dashboard import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live):
    context = browser.new_context(base_url=live.url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


@pytest.mark.browser
def test_the_comparison_page_shows_a_table_and_a_chart(page, live, transformer_group):
    wait_for_group(live.url, transformer_group)
    page.goto(f"/ui/groups/{transformer_group}")
    assert page.locator("#group").get_attribute("data-status") == "succeeded"
    rows = page.locator("#compare-table tbody tr")
    assert sorted(rows.nth(i).get_attribute("data-target") for i in range(rows.count())) == sorted(ALL)
    cpu = page.locator("#compare-table tr[data-target=cpu-ort]")
    # Each figure as the job's report writes it (µs below a millisecond), the same text as its job page.
    assert re.fullmatch(r"[\d.]+ (µs|ms|s)", cpu.locator("td[data-field=latency] .src.measured").inner_text())
    orin = page.locator("#compare-table tr[data-target=nvidia-orin-nano]")
    assert re.fullmatch(r"(≥ )?[\d.]+ (µs|ms|s)", orin.locator("td[data-field=latency] .src.estimate").inner_text())
    assert "roofline estimate" in orin.locator("td[data-field=latency]").get_attribute("title")
    assert orin.locator("td[data-field=flop_share]").inner_text().endswith("%")
    chart = page.locator("svg#compare-chart")
    assert chart.is_visible()
    # Measured and estimated latencies never share an axis: one panel each, each scaled to its own largest.
    measured, estimated = chart.locator("g.panel").nth(0), chart.locator("g.panel").nth(1)
    assert measured.locator(".panel-title").text_content() == "Latency, measured on this CPU"
    assert estimated.locator(".panel-title").text_content().startswith("Latency, roofline estimate on each target")
    assert measured.locator("rect.bar.measured").count() == measured.locator("g.bar-row").count() == 1  # cpu-ort
    assert estimated.locator("rect.bar.estimate").count() == estimated.locator("g.bar-row").count() == len(ALL) - 1
    widths = [float(w) for w in estimated.locator("rect.bar").evaluate_all("rs => rs.map(r => r.getAttribute('width'))")]
    assert max(widths) == pytest.approx(300, abs=1) and min(widths) > 0
    page.screenshot(path=str(SHOTS / "flexdsa-compare-group.png"), full_page=True)
    # Linked from the jobs list and from each job's page.
    page.goto("/")
    page.locator(f"a[href$='/ui/groups/{transformer_group}']").first.click()
    page.wait_for_url(re.compile(rf"/ui/groups/{transformer_group}$"))
    page.locator("#compare-table tr[data-target=rockchip-rk3588] a").click()
    page.wait_for_url(re.compile(r"/ui/jobs/[0-9a-f-]{36}$"))
    assert page.locator("#job-group").get_attribute("href").endswith(f"/ui/groups/{transformer_group}")


@pytest.mark.browser
def test_the_upload_form_compares_several_targets(page, live, tmp_path):
    model = tmp_path / "leaky.onnx"
    model.write_bytes(tiny_onnx(alpha=0.37))
    page.goto("/")
    form = page.locator("#upload-form")
    form.locator("input[name=model]").set_input_files(str(model))
    form.locator("input[name=targets][value=cpu-ort]").check()
    form.locator("input[name=targets][value=nvidia-orin-nano]").check()
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r"/ui/groups/[0-9a-f-]{36}$"))
    group_id = page.locator("#group").get_attribute("data-group-id")
    # The page reloads itself while jobs run.
    page.wait_for_selector("#group[data-status=succeeded]", timeout=GROUP_TIMEOUT_S * 1000)
    group = httpx.get(f"{live.url}/groups/{group_id}", timeout=10).json()
    assert group["targets"] == ["cpu-ort", "nvidia-orin-nano"] and group["model_filename"] == "leaky.onnx"
    rows = page.locator("#compare-table tbody tr")
    assert [rows.nth(i).get_attribute("data-target") for i in range(rows.count())] == ["cpu-ort", "nvidia-orin-nano"]
    panels = page.locator("svg#compare-chart g.panel")
    assert panels.nth(0).locator("rect.bar").count() == panels.nth(1).locator("rect.bar").count() == 1
