#!/usr/bin/env bash
# Smoke check of the docker-compose.yml stack, done the way a user would: wait until the API is ready, create an
# API key with `flexdsa keys create`, submit examples/tiny_bert.onnx for cpu-ort, poll the job until it
# succeeds, download its bundle.zip and check it is a valid zip. Exits non-zero on the first failure.
#
#   docker compose up -d --build && scripts/docker-smoke.sh     (or: make docker)
#
# Needs curl and python3 on the host. Not run by CI. Settings (environment):
#   FLEXDSA_API_PORT      the port docker-compose.yml publishes the API on (default 8000)
#   SMOKE_READY_TIMEOUT   seconds to wait for /readyz (default 180)
#   SMOKE_JOB_TIMEOUT     seconds to wait for the job (default 300)
#   COMPOSE               the compose command (default: `docker compose`, else `docker-compose`)
set -euo pipefail
cd "$(dirname "$0")/.."

BASE="http://localhost:${FLEXDSA_API_PORT:-8000}"
READY_TIMEOUT=${SMOKE_READY_TIMEOUT:-180}
JOB_TIMEOUT=${SMOKE_JOB_TIMEOUT:-300}
MODEL=examples/tiny_bert.onnx
if [ -z "${COMPOSE:-}" ]; then
  if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE="docker-compose"; fi
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

fail() {
  echo "docker-smoke: FAIL: $*" >&2
  echo "docker-smoke: service states and recent logs follow" >&2
  $COMPOSE ps >&2 || true
  $COMPOSE logs --tail=40 api worker migrate >&2 || true
  exit 1
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

# 1. Ready: database migrated and reachable, broker, Redis and artifact store (the api healthcheck's probe).
t0=$(now)
until curl -fsS -o "$TMP/readyz" "$BASE/readyz" 2>/dev/null; do
  [ "$(since "$t0" | cut -d. -f1)" -lt "$READY_TIMEOUT" ] || fail "$BASE/readyz not ready after ${READY_TIMEOUT}s: $(cat "$TMP/readyz" 2>/dev/null)"
  sleep 2
done
echo "docker-smoke: /readyz ready after $(since "$t0")s: $(cat "$TMP/readyz")"
curl -fsS "$BASE/healthz" >"$TMP/healthz" || fail "GET /healthz failed"
[ "$(json '["status"]' <"$TMP/healthz")" = ok ] || fail "/healthz is not ok: $(cat "$TMP/healthz")"
echo "docker-smoke: /healthz: $(cat "$TMP/healthz")"

# 2. An API key, created the documented way. --no-deps: the stack is already up and migrated. A new tenant
# each run: results are cached per tenant, and an answer from the cache would not exercise the workers.
TENANT="smoke-$(date -u +%Y%m%dT%H%M%S)"
KEY=$($COMPOSE run --rm --no-deps -T api flexdsa keys create --tenant "$TENANT" --name docker-smoke | grep -m1 '^fdsa_') \
  || fail "flexdsa keys create printed no key"
echo "docker-smoke: API key created for tenant $TENANT (prefix ${KEY:0:17})"

# 3. Submit, poll until finished.
t1=$(now)
code=$(curl -sS -o "$TMP/submit" -w '%{http_code}' -H "X-API-Key: $KEY" \
  -F "model=@$MODEL" -F 'spec={"target":"cpu-ort"}' "$BASE/optimize") || fail "POST /optimize: curl failed"
[ "$code" = 202 ] || [ "$code" = 200 ] || fail "POST /optimize answered $code: $(cat "$TMP/submit")"
JOB=$(json '["job_id"]' <"$TMP/submit") || fail "no job_id in $(cat "$TMP/submit")"
[ "$(json '["cached"]' <"$TMP/submit")" = False ] || fail "job $JOB was answered from the cache: no worker ran it"
echo "docker-smoke: job $JOB submitted ($code)"
while :; do
  curl -fsS -H "X-API-Key: $KEY" "$BASE/jobs/$JOB" >"$TMP/job" || fail "GET /jobs/$JOB failed"
  status=$(json '["status"]' <"$TMP/job")
  case "$status" in
    succeeded) break ;;
    failed|cancelled) fail "job $JOB $status: $(json '["error"]' <"$TMP/job")" ;;
  esac
  [ "$(since "$t1" | cut -d. -f1)" -lt "$JOB_TIMEOUT" ] || fail "job $JOB still $status after ${JOB_TIMEOUT}s"
  sleep 1
done
echo "docker-smoke: job succeeded in $(since "$t1")s (queued $(json '["queued_seconds"]' <"$TMP/job")s," \
  "run $(json '["run_seconds"]' <"$TMP/job")s, speedup $(json '["report_summary"]["speedup"]' <"$TMP/job"))"

# 4. The bundle: downloads, and is a zip whose members all read back.
curl -fsS -H "X-API-Key: $KEY" -o "$TMP/bundle.zip" "$BASE/jobs/$JOB/artifacts/bundle.zip" \
  || fail "GET /jobs/$JOB/artifacts/bundle.zip failed"
members=$(python3 -c "
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
assert z.testzip() is None, 'corrupt member'
assert any(n.endswith('.onnx') for n in z.namelist()), 'no .onnx model inside'
print(len(z.namelist()))" "$TMP/bundle.zip") || fail "bundle.zip is not a valid bundle"
echo "docker-smoke: bundle.zip downloaded ($(wc -c <"$TMP/bundle.zip") bytes, $members files)"
echo "docker-smoke: OK in $(since "$t0")s"
