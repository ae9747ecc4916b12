#!/usr/bin/env bash
# The production web server, one command for the README, deployments and the test that
# boots the production recipe (tests/observability/test_production.py).
#   HOST (0.0.0.0), PORT (8000), WEB_WORKERS (4), WEB_THREADS (4), PYTHON (.venv/bin/python)
# Every process of a node shares PROMETHEUS_MULTIPROC_DIR (see scripts/production.env);
# empty that folder when the node boots, not here: other processes may be writing to it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
access_format='%(addr)s "%(method)s %(path)s" %(status)d %(dt_ms).0fms'
if [ "${LOG_FORMAT:-}" = "json" ]; then
  access_format='{"event": "http_request", "logger": "granian.access", "method": "%(method)s", "path": "%(path)s", "status": %(status)d, "duration_ms": %(dt_ms).1f}'
fi
# granian (WSGI): WEB_WORKERS processes × WEB_THREADS blocking threads each; the README's
# "Benchmarks" has the measurement against gunicorn that chose it.
exec "$PY" -m granian --interface wsgi config.wsgi:application \
  --host "${HOST:-0.0.0.0}" --port "${PORT:-8000}" --no-ws \
  --workers "${WEB_WORKERS:-4}" --blocking-threads "${WEB_THREADS:-4}" \
  --access-log --access-log-fmt "$access_format"
