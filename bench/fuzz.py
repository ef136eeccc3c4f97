"""Generated requests at volume: ``python -m bench.fuzz [--requests 10000]`` (issue 9).

Schemathesis generates requests from the service's own OpenAPI document (positive and negative cases) for
every operation, sent in-process (ASGI) to the app on embedded defaults in a temporary folder, with a valid
tenant key and the operator token. It prints the answers by status and every 5xx with its request; the
goal is 0 server errors. The test suite runs the same check with a few hundred requests
(``tests/service/test_fuzz_api.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

OPERATOR_TOKEN = "operator-token-for-bench-fuzz"
OPERATOR_PATHS = ("/metrics", "/incidents", "/incidents/{incident_id}", "/cache/stats")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="about this many requests in all")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import schemathesis
    from fastapi.testclient import TestClient
    from hypothesis import HealthCheck, given, seed, settings
    from pydantic import SecretStr

    from service.app import create_app
    from service.auth.keys import create_api_key
    from service.core.config import Settings

    folder = Path(tempfile.mkdtemp(prefix="flexdsa-fuzz-"))
    app = create_app(
        Settings(
            data_dir=folder, auth="required", embedded_worker=False, operator_token=SecretStr(OPERATOR_TOKEN),
            submit_rate_per_minute=10**9, max_queued_jobs_per_tenant=10**9,
        )
    )  # fmt: skip
    statuses: collections.Counter = collections.Counter()
    server_errors: list[str] = []
    started = time.perf_counter()
    with TestClient(app):
        with app.state.session_factory() as session:
            key, _ = create_api_key(session, "fuzz", "bench")
            session.commit()
        api = schemathesis.openapi.from_asgi("/openapi.json", app)
        operations = [result.ok() for result in api.get_all_operations()]
        per_operation = max(1, args.requests // len(operations))
        round_seed = args.seed
        # Hypothesis stops early on operations with few distinct inputs: new seeds until the count is reached.
        while sum(statuses.values()) < args.requests:
            before = sum(statuses.values())
            for operation in operations:

                @seed(round_seed)
                @given(case=operation.as_strategy())
                @settings(max_examples=per_operation, deadline=None, suppress_health_check=list(HealthCheck), database=None)
                def send(case):
                    headers = dict(case.headers or {})
                    headers["X-API-Key"] = key  # generated keys would only test the 401 path
                    if case.path in OPERATOR_PATHS:
                        headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
                    try:
                        response = case.call(headers=headers)
                    except Exception as err:  # the ASGI client re-raises what the app did not handle: a 500
                        statuses[500] += 1
                        server_errors.append(f"{case.method} {case.formatted_path} -> {type(err).__name__}: {err}"[:400])
                        return
                    statuses[response.status_code] += 1
                    if response.status_code >= 500:
                        server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}")

                send()
                print(f"{operation.label}: {sum(statuses.values())} requests so far", file=sys.stderr, flush=True)
            round_seed += 1
            if sum(statuses.values()) == before:
                break
    result = {
        "requests": sum(statuses.values()),
        "operations": len(operations),
        "by_status": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": len(server_errors),
        "examples": server_errors[:10],
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "fuzz.json").write_text(json.dumps(result, indent=2))
    return 1 if server_errors else 0


if __name__ == "__main__":
    sys.exit(main())
