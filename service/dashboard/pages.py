"""Rendering the dashboard's pages: the Jinja2 templates in ``service/dashboard/templates``, their formatting filters,
and the context every page shares (the mount point, version, mode, who is logged in).

Filters: ``filesize`` (bytes in B/KB/MB/GB, base 1024), ``seconds`` (µs below a millisecond, ms below a
second, three significant digits as every figure, minutes from two minutes on), ``when`` (a UTC timestamp), ``speed_tone`` (the colour of a headline
speed-up: green only when faster as shown). A value that is not a number reads "–".
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from flexdsa_core import __version__
from flexdsa_core.figures import seconds_text
from service.auth.sessions import is_operator, logged_in

DASHBOARD_DIR = Path(__file__).resolve().parent
STATIC_DIR = DASHBOARD_DIR / "static"
templates = Jinja2Templates(directory=str(DASHBOARD_DIR / "templates"))
NOT_FOUND = "There is nothing at this address."


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _filesize(size: int | None) -> str:
    if not _number(size):
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _seconds(value: float | None) -> str:
    """Below a second as every figure is written (``flexdsa_core.figures.seconds_text``)."""
    if not _number(value):
        return "–"
    if value < 1:
        return seconds_text(value)
    return f"{value:.2f} s" if value < 120 else f"{value / 60:.1f} min"


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "–"


def _speed_tone(headline: dict | None) -> str:
    """The class a speed-up is shown in: green only for a figure that is faster as shown (a measured verdict
    'faster', or an estimate above 1.00x at two decimals); amber for slower; plain for 1.00x or a tie."""
    if not isinstance(headline, dict) or not _number(headline.get("speedup")):
        return ""
    shown = round(headline["speedup"], 2)
    verdict = headline.get("verdict")
    if verdict == "no significant difference" or shown == 1.0:
        return ""
    if verdict == "slower" or (verdict is None and shown < 1.0):
        return "warn-text"
    if verdict == "faster" or (verdict is None and shown > 1.0):
        return "ok-text" if shown > 1.0 else ""
    return ""


templates.env.filters.update(filesize=_filesize, seconds=_seconds, when=_when, speed_tone=_speed_tone)


def root(request: Request) -> str:
    """Where the app is mounted (behind a proxy's path prefix): every link on a page starts with it."""
    return request.scope.get("root_path", "")


def render(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    settings = request.app.state.settings
    context.update(
        root=root(request),
        version=__version__,
        mode=settings.mode,
        auth=settings.auth,
        logged_in=logged_in(request),
        operator=is_operator(request),
    )
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def not_found(request: Request) -> HTMLResponse:
    # One answer for a tenant, a wrong token and an unknown id alike: incident ids cannot be probed.
    return render(request, "not_found.html", status_code=404, heading="Not found", message=NOT_FOUND)


def login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{root(request)}/ui/login?next={quote(target)}", status_code=303)
