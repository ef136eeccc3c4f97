#!/usr/bin/env bash
# The service tests talk to a real PostgreSQL and Redis. Fail loudly, naming what is missing, before
# pytest starts, rather than letting every test error out one by one.
set -uo pipefail
db_url=${FLEXDSA_TEST_DATABASE_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/test}
redis_url=${FLEXDSA_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
.venv/bin/python - "$db_url" "$redis_url" <<'PY'
import sys
import psycopg, redis
db_url, redis_url = sys.argv[1], sys.argv[2]
failed = []
try:
    psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), connect_timeout=5).close()
except Exception as err:
    failed.append(f"PostgreSQL at {db_url}: {err}")
try:
    redis.Redis.from_url(redis_url, socket_connect_timeout=5).ping()
except Exception as err:
    failed.append(f"Redis at {redis_url}: {err}")
if failed:
    print("The test suite needs these services and cannot reach them:\n  " + "\n  ".join(failed), file=sys.stderr)
    print("Start them (see README, 'Running the tests') or point FLEXDSA_TEST_DATABASE_URL / FLEXDSA_TEST_REDIS_URL elsewhere.", file=sys.stderr)
    sys.exit(1)
PY
