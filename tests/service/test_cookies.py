"""The dashboard's login cookies are Secure where the service is deployed, even behind a proxy that terminates
TLS and hands the API plain HTTP (the request's scheme alone lost the flag there)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from service.auth.sessions import secure_cookie
from service.core.config import Settings


class _App:
    def __init__(self, settings: Settings) -> None:
        self.state = type("State", (), {"settings": settings})()


def _request(settings: Settings, url: str) -> Request:
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    return Request({
        "type": "http", "method": "POST", "scheme": scheme, "path": "/" + path, "raw_path": b"",
        "query_string": b"", "headers": [(b"host", host.encode())], "server": (host, 80), "app": _App(settings),
    })  # fmt: skip


DISTRIBUTED = {"broker_url": "redis://broker/0", "database_url": "postgresql+psycopg://db/flexdsa"}


@pytest.mark.parametrize(
    ("settings", "url", "secure"),
    [
        # Behind a TLS-terminating proxy: plain HTTP reaches the API, under the service's real host name.
        (DISTRIBUTED, "http://flexdsa.example.com/ui/login", True),
        (DISTRIBUTED, "https://flexdsa.example.com/ui/login", True),
        # docker compose on the developer's own machine, over plain HTTP.
        (DISTRIBUTED, "http://localhost:8000/ui/login", False),
        (DISTRIBUTED, "http://127.0.0.1:8000/ui/login", False),
        # Embedded: what the request says.
        ({}, "http://127.0.0.1:8000/ui/login", False),
        ({}, "https://laptop.example/ui/login", True),
        # The operator decides, whatever the rest says.
        ({**DISTRIBUTED, "secure_cookies": False}, "http://flexdsa.example.com/ui/login", False),
        ({"secure_cookies": True}, "http://127.0.0.1:8000/ui/login", True),
    ],
)
def test_the_secure_flag_survives_a_tls_terminating_proxy(tmp_path, settings, url, secure):
    assert secure_cookie(_request(Settings(data_dir=tmp_path, **settings), url)) is secure
