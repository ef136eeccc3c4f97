"""The API reference: Swagger UI at ``/docs``, its files served from ``service/dashboard/static/swagger-ui/``.

FastAPI's built-in page loads Swagger UI from a CDN, so on a machine without internet (or behind a strict
proxy) ``/docs`` was blank. This page is the same Swagger UI, vendored (Apache-2.0, its licence beside
it), and references nothing outside the service: no CDN, no favicon from elsewhere, no online validator.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, Response

router = APIRouter(include_in_schema=False)

SWAGGER_UI_VERSION = "5.35.0"
SWAGGER_UI_DIR = Path(__file__).resolve().parent / "static" / "swagger-ui"
# The only files served, by name: nothing else in (or outside) the folder can be asked for.
_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon-32x32.png": "image/png",
    "LICENSE": "text/plain",
    "NOTICE": "text/plain",
}


@router.get("/docs", response_class=HTMLResponse)
def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    assets = f"{root}/docs/static"
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js?v={SWAGGER_UI_VERSION}",
        swagger_css_url=f"{assets}/swagger-ui.css?v={SWAGGER_UI_VERSION}",
        swagger_favicon_url=f"{assets}/favicon-32x32.png",
        # The default would send the whole API document to an online validator and show its badge.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/docs/static/{name}")
def swagger_ui_asset(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        return Response("Not found", status_code=404, media_type="text/plain")
    return FileResponse(
        SWAGGER_UI_DIR / name, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"}
    )
