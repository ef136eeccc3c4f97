"""The manual (``make docs``: mkdocs-material, ``mkdocs.yml``) builds strictly, its reference pages cover the code
they are generated from, and its pages fetch nothing from elsewhere (opened in headless Chromium over a local
HTTP server, every request is recorded: none leaves this machine)."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.service.test_dashboard import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def test_the_http_api_page_lists_every_operation(site):
    from service.app import create_app
    from service.core.config import Settings

    page = (site / "reference" / "http-api.html").read_text()
    operations = create_app(Settings(data_dir=site / "_data", embedded_worker=False)).openapi()["paths"]
    missing = [path for path in operations if path not in page]
    assert operations and missing == []


def test_the_options_page_lists_every_option(site):
    from flexdsa_core import RequestSpec

    page = (site / "reference" / "options.html").read_text()
    fields = list(RequestSpec.model_fields)
    assert fields and [name for name in fields if f"<code>{name}</code>" not in page] == []


def test_no_page_fetches_anything_from_elsewhere(site):
    from playwright.sync_api import sync_playwright

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    assert "index.html" in pages and "reference/http-api.html" in pages
    elsewhere: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.on("request", lambda request: urlsplit(request.url).hostname not in ("127.0.0.1", None)
                    and not request.url.startswith(("data:", "blob:")) and elsewhere.append(request.url))  # fmt: skip
            for name in pages:
                page.goto(f"{base}/{name}", wait_until="networkidle")
            page.goto(f"{base}/index.html", wait_until="networkidle")
            page.keyboard.press("/")  # the search box, whose index loads from the site itself
            page.keyboard.type("bucket")
            page.wait_for_selector(".md-search-result__item", timeout=10_000)
            browser.close()
    finally:
        server.shutdown()
    assert elsewhere == []
