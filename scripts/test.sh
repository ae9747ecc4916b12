#!/usr/bin/env bash
# Runs the suite on SQLite, then on PostgreSQL when DATABASE_URL is set or the local
# server answers. Writes var/test-postgres.ok only after a PostgreSQL run that passed,
# so CI can tell a skipped PostgreSQL run from a green one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p var
rm -f var/test-postgres.ok

echo "== pytest on SQLite =="
env -u DATABASE_URL $PY -m pytest "$@"

PG_URL="${DATABASE_URL:-}"
if [ -z "$PG_URL" ]; then
  if $PY - <<'PY' 2>/dev/null; then PG_URL="postgres://postgres@127.0.0.1:5432/test"; fi
import psycopg
psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", connect_timeout=2).close()
PY
fi
if [ -n "$PG_URL" ]; then
  echo "== pytest on PostgreSQL =="
  DATABASE_URL="$PG_URL" $PY -m pytest "$@"
  date -u +%FT%TZ > var/test-postgres.ok
else
  echo "== PostgreSQL not reachable: PostgreSQL run skipped =="
fi
