#!/usr/bin/env bash
# Runs the whole suite on SQLite, then on PostgreSQL when DATABASE_URL is set or the local
# server answers. Writes var/test-postgres.ok only after a PostgreSQL run that passed,
# so CI can tell a skipped PostgreSQL run from a green one.
#
# Each pass runs on TEST_WORKERS pytest-xdist workers (default: one per core), each with a
# test database of its own (pytest-django suffixes the name: test_x_gw0, test.sqlite3_gw0).
# In the PostgreSQL pass the tests marked `serial` (tests/conftest.py's SERIAL: suites that
# share a cache or a lock, and the soak) run after the parallel run, one at a time; on
# SQLite they are heavy, hence skipped. Tests run in random order (pytest-randomly) with one
# seed for both passes, printed first: TEST_SEED=<seed> repeats an order, and
# `-p no:randomly` among the arguments keeps file order.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p var
rm -f var/test-postgres.ok

WORKERS="${TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
ORDER=()
if [[ " $* " != *"no:randomly"* ]]; then
  SEED="${TEST_SEED:-$((RANDOM * 32768 + RANDOM))}"
  ORDER=(--randomly-seed="$SEED")
  echo "== random order: seed $SEED (repeat it with TEST_SEED=$SEED) =="
fi
# The slowest tests of each pass, printed at its end: CI's record of where the loop's time goes.
DURATIONS=(--durations=20 --durations-min=5)
PARALLEL=(-n "$WORKERS")
if [ "$WORKERS" -le 1 ]; then PARALLEL=(-p no:xdist); fi

# Runs "$@", then prints how long it took and how it ended; returns its exit status.
timed() {
  local name=$1 started=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "== $name: $((SECONDS - started)) s, exit $status =="
  return "$status"
}

echo "== pytest on SQLite ($WORKERS workers) =="
timed "SQLite pass" env -u DATABASE_URL $PY -m pytest "${PARALLEL[@]}" "${ORDER[@]}" "${DURATIONS[@]}" "$@"

PG_URL="${DATABASE_URL:-}"
if [ -z "$PG_URL" ]; then
  if $PY - <<'PY' 2>/dev/null; then PG_URL="postgres://postgres@127.0.0.1:5432/test"; fi
import psycopg
psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", connect_timeout=2).close()
PY
fi
if [ -n "$PG_URL" ]; then
  echo "== pytest on PostgreSQL ($WORKERS workers, then the serial suites one at a time) =="
  started=$SECONDS
  timed "PostgreSQL parallel run" env DATABASE_URL="$PG_URL" $PY -m pytest "${PARALLEL[@]}" "${ORDER[@]}" "${DURATIONS[@]}" -m "not serial" "$@"
  # Exit 5 is "no tests collected": arguments that name no serial test are not a failure.
  status=0
  timed "PostgreSQL serial run" env DATABASE_URL="$PG_URL" $PY -m pytest -p no:xdist "${ORDER[@]}" "${DURATIONS[@]}" -m serial "$@" || status=$?
  if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
  echo "== PostgreSQL pass: $((SECONDS - started)) s =="
  date -u +%FT%TZ > var/test-postgres.ok
else
  echo "== PostgreSQL not reachable: PostgreSQL run skipped =="
fi
