"""``/docs`` works offline: Swagger UI and its files come from the service itself, nothing from elsewhere.

The first tests read the page and its assets over the test client; the last renders ``/docs`` in headless
Chromium against a real server with every request to another origin blocked, and checks that the API's
operations appear (a screenshot goes to the temp folder as ``flexdsa-docs-offline.png``).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from tests.service.live import embedded_server

# Any reference a browser would follow: src/href attributes, CSS url(), and bare absolute URLs.
_REFERENCES = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url\(\s*["']?([^"')]+)""", re.I)


def _references(html: str) -> list[str]:
    return [a or b for a, b in _REFERENCES.findall(html)]


def test_docs_page_references_only_this_service(env):
    response = env.client.get("/docs")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    references = _references(html)
    assert len(references) >= 3  # the script, the stylesheet, the icon
    for reference in references:
        assert reference.startswith("/") and not reference.startswith("//"), reference
        asset = env.client.get(reference)
        assert asset.status_code == 200 and asset.content, reference
    assert "url: '/openapi.json'" in html and '"validatorUrl": null' in html


def test_swagger_ui_assets_and_licence_are_served(env):
    script = env.client.get("/docs/static/swagger-ui-bundle.js")
    assert script.headers["content-type"].startswith("text/javascript") and b"SwaggerUIBundle" in script.content
    assert "sourceMappingURL" not in script.text[-500:]  # no request for a map that is not shipped
    assert env.client.get("/docs/static/swagger-ui.css").headers["content-type"].startswith("text/css")
    assert "Apache License" in env.client.get("/docs/static/LICENSE").text


@pytest.mark.parametrize(
    "name", ["README.md", "..%2F..%2Fconfig.py", "swagger-ui-bundle.js.LICENSE.txt%00", "nothing.js"]
)
def test_only_the_listed_assets_are_served(env, name):
    assert env.client.get(f"/docs/static/{name}").status_code in (404, 422)


def test_the_cdn_pages_are_gone(env):
    assert env.client.get("/redoc").status_code == 404
    assert env.client.get("/openapi.json").status_code == 200


@pytest.mark.browser
def test_docs_render_in_chromium_with_the_network_blocked(tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.service.test_dashboard import CHROMIUM, CHROMIUM_ARGS

    with embedded_server(tmp_path, embedded_worker="false") as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(base_url=server.url, viewport={"width": 1300, "height": 900})
            blocked: list[str] = []

            def only_this_server(route):
                if route.request.url.startswith(server.url):
                    return route.continue_()
                blocked.append(route.request.url)
                return route.abort()

            context.route("**/*", only_this_server)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto("/docs")
            page.wait_for_selector(".swagger-ui .opblock", timeout=30_000)
            paths = page.locator(".opblock-summary-path").all_inner_texts()
            assert any("/optimize" in path for path in paths), paths
            assert page.locator(".swagger-ui .info .title").inner_text().startswith("Flex-DSA")
            page.screenshot(path=str(Path(tempfile.gettempdir()) / "flexdsa-docs-offline.png"))
            assert not blocked, f"/docs asked for other origins: {blocked}"
            assert not errors, f"JavaScript errors: {errors}"
        finally:
            browser.close()
