#!/usr/bin/env bash
# The service tests talk to a real PostgreSQL and Redis. Fail loudly, naming what is missing, before
# pytest starts, rather than letting every test error out one by one.
set -uo pipefail
# The same addresses and variables as the tests' own fixtures (tests/conftest.py, tests/workers/conftest.py).
pg_url=${FLEXDSA_TEST_PG_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
service_redis=${FLEXDSA_TEST_SERVICE_REDIS_URL:-redis://127.0.0.1:6379/11}
worker_redis=${FLEXDSA_TEST_REDIS_URL:-redis://127.0.0.1:6379/13}
.venv/bin/python - "$pg_url" "$service_redis" "$worker_redis" <<'PY'
import sys
import psycopg, redis
pg_url, *redis_urls = sys.argv[1:]
failed = []
try:
    psycopg.connect(pg_url, connect_timeout=5).close()
except Exception as err:
    failed.append(f"PostgreSQL at {pg_url}: {err}")
for redis_url in redis_urls:
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=5).ping()
    except Exception as err:
        failed.append(f"Redis at {redis_url}: {err}")
if failed:
    print("The test suite needs these services and cannot reach them:\n  " + "\n  ".join(failed), file=sys.stderr)
    print("Start them (see README, 'Running the tests') or point FLEXDSA_TEST_PG_ADMIN_URL / FLEXDSA_TEST_SERVICE_REDIS_URL / FLEXDSA_TEST_REDIS_URL elsewhere.", file=sys.stderr)
    sys.exit(1)
PY
