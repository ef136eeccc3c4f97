"""Talking to the Flex-DSA service from a deployment: send the traffic, fetch a job's bundle. Standard
library only (``urllib``), so a device needs nothing beyond numpy and its runtime.

    push_traffic(server, job_id, runtime.traffic.snapshot(), api_key=KEY)   # POST /jobs/{id}/traffic
    download_bundle(server, job_id, "bundle.zip", api_key=KEY)              # GET /jobs/{id}/artifacts/bundle.zip

The API key goes to the server's origin (scheme, host and port of ``server``) and nowhere else: a service
with an object store answers the download with a 307 to a presigned URL, which is followed without the key
(``_KeyStaysWithTheService``), as ``flexdsa submit`` does. The bundle is checked against the sha-256 the
service states in its RFC 9530 ``Repr-Digest`` header (on the 307 or on the file itself) before it is
renamed into place; a bundle without one, or with other bytes, is refused and nothing is left behind.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flexdsa_runtime.errors import RuntimeRefusal

# Headers that carry a credential, never sent to another origin than the server's.
_CREDENTIALS = frozenset({"x-api-key", "authorization", "cookie"})
_CHUNK = 1 << 20


class ServiceError(RuntimeRefusal):
    """The service answered with an error (its JSON error body's message), or could not be reached."""


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"http": 80, "https": 443}.get(scheme)
    except ValueError:  # not a port: an origin equal to no other
        return scheme, url, -1
    return scheme, (parts.hostname or "").lower(), port


class _KeyStaysWithTheService(urllib.request.HTTPRedirectHandler):
    """Follows redirects over http(s) only, dropping every credential header once a redirect leaves the
    server's origin (it is not put back if a later one returns); keeps the first ``Repr-Digest`` the server's
    origin stated on a redirect."""

    def __init__(self, server: str) -> None:
        self.origin = _origin(server)
        self.stated_digest: str | None = None

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        scheme = urlsplit(newurl).scheme.lower()
        if scheme not in ("http", "https"):
            fp.close()
            raise ServiceError(
                f"{req.full_url}: the answer redirects to {scheme}:, which this client does not follow.",
                details={"location": newurl},
            )
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        if self.stated_digest is None and _origin(req.full_url) == self.origin:
            self.stated_digest = headers.get("Repr-Digest")
        if _origin(newurl) != self.origin:
            for name in list(new.headers):
                if name.lower() in _CREDENTIALS:
                    new.remove_header(name)
        return new


def _open(url: str, *, api_key: str | None, data: bytes | None = None, method: str = "GET"):
    """The response to one request to the service (its redirects followed by ``_KeyStaysWithTheService``),
    and that handler, which holds the digest a redirect stated."""
    headers = {"Accept": "application/json"}
    if api_key:
        headers["X-API-Key"] = api_key
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    redirects = _KeyStaysWithTheService(url)
    try:
        return urllib.request.build_opener(redirects).open(request, timeout=60), redirects
    except urllib.error.HTTPError as err:
        try:
            body = json.loads(err.read())["error"]
        except Exception:  # noqa: BLE001 - not our JSON error shape: report the status alone
            body = {"code": "http_error", "message": f"HTTP {err.code}"}
        raise ServiceError(f"{url}: {err.code} {body.get('message')}", details=body) from None
    except urllib.error.URLError as err:
        raise ServiceError(f"{url}: the service is unreachable ({err.reason})") from None


def push_traffic(server: str, job_id: str, snapshot: dict[str, Any], *, api_key: str | None = None) -> dict:
    """Send one traffic snapshot (``Traffic.snapshot()``) to the job; returns the service's summary."""
    url = f"{server.rstrip('/')}/jobs/{job_id}/traffic"
    response, _ = _open(url, api_key=api_key, data=json.dumps(snapshot).encode(), method="POST")
    with response:
        return json.loads(response.read())


def download_bundle(server: str, job_id: str, destination: str | Path, *, api_key: str | None = None) -> Path:
    """The job's ``bundle.zip`` saved at ``destination``: written beside it first (``.part``), checked against
    the sha-256 the service stated, then renamed; on any failure nothing is left at either path."""
    destination = Path(destination)
    partial = destination.with_name(destination.name + ".part")
    url = f"{server.rstrip('/')}/jobs/{job_id}/artifacts/bundle.zip"
    try:
        response, redirects = _open(url, api_key=api_key)
        with response, partial.open("wb") as sink:
            stated = redirects.stated_digest
            if stated is None and _origin(response.url) == redirects.origin:
                stated = response.headers.get("Repr-Digest")
            expected = _sha256_of_digest(stated)
            if expected is None:
                raise ServiceError(
                    f"{url}: the service stated no sha-256 (Repr-Digest) for the bundle, so the download cannot "
                    "be checked: refused. A Flex-DSA service states one on every artifact; is a proxy between "
                    "this device and the service dropping it?",
                    details={"repr_digest": stated},
                )
            digest = hashlib.sha256()
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                sink.write(chunk)
        received = digest.hexdigest()
        if received != expected:
            raise ServiceError(
                f"{url}: the bytes received do not match the sha-256 the service stated ({received[:12]}... "
                f"instead of {expected[:12]}...): the bundle was changed on its way or in the store; nothing was "
                "saved. Try again; if it persists, tell the service's operator.",
                details={"expected": expected, "received": received},
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(destination)
    return destination


def _sha256_of_digest(header: str | None) -> str | None:
    """The hex sha-256 in an RFC 9530 ``Repr-Digest`` header (``sha-256=:<base64>:``), or None (the contract of
    the service's artifact routes, read the same way as ``flexdsa submit`` does)."""
    for item in (header or "").split(","):
        algorithm, _, value = item.strip().partition("=")
        if algorithm.lower() == "sha-256" and value.startswith(":") and value.endswith(":"):
            try:
                raw = base64.b64decode(value[1:-1], validate=True)
            except (binascii.Error, ValueError):
                return None
            return raw.hex() if len(raw) == hashlib.sha256().digest_size else None
    return None
