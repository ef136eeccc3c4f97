"""Talking to the Flex-DSA service from a deployment: send the traffic, fetch a job's bundle. Standard
library only (``urllib``), so a device needs nothing beyond numpy and its runtime.

    push_traffic(server, job_id, runtime.traffic.snapshot(), api_key=KEY)   # POST /jobs/{id}/traffic
    download_bundle(server, job_id, "bundle.zip", api_key=KEY)              # GET /jobs/{id}/artifacts/bundle.zip
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flexdsa_runtime.errors import RuntimeRefusal


class ServiceError(RuntimeRefusal):
    """The service answered with an error (its JSON error body's message), or could not be reached."""


def _request(url: str, *, api_key: str | None, data: bytes | None = None, method: str = "GET"):
    headers = {"Accept": "application/json"}
    if api_key:
        headers["X-API-Key"] = api_key
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        return urllib.request.urlopen(request, timeout=60)
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
    with _request(url, api_key=api_key, data=json.dumps(snapshot).encode(), method="POST") as response:
        return json.loads(response.read())


def download_bundle(server: str, job_id: str, destination: str | Path, *, api_key: str | None = None) -> Path:
    """The job's ``bundle.zip`` saved at ``destination`` (written beside it first, then renamed)."""
    destination = Path(destination)
    partial = destination.with_name(destination.name + ".part")
    url = f"{server.rstrip('/')}/jobs/{job_id}/artifacts/bundle.zip"
    with _request(url, api_key=api_key) as response, partial.open("wb") as sink:
        shutil.copyfileobj(response, sink, 1 << 20)
    partial.replace(destination)
    return destination
