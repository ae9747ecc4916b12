#!/usr/bin/env bash
# The production web server, one command for the README, deployments and the test that
# boots the production recipe (tests/observability/test_production.py).
#   HOST (0.0.0.0), PORT (8000), WEB_WORKERS (4), WEB_THREADS (4), PYTHON (.venv/bin/python)
# Every process of a node shares PROMETHEUS_MULTIPROC_DIR (see scripts/production.env);
# empty that folder when the node boots, not here: other processes may be writing to it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
access_format='%(h)s "%(m)s %(U)s" %(s)s %(M)sms'
if [ "${LOG_FORMAT:-}" = "json" ]; then
  access_format='{"event": "http_request", "logger": "gunicorn.access", "method": "%(m)s", "path": "%(U)s", "status": %(s)s, "duration_ms": %(M)s}'
fi
exec "$PY" -m gunicorn config.wsgi:application \
  --bind "${HOST:-0.0.0.0}:${PORT:-8000}" \
  --workers "${WEB_WORKERS:-4}" --threads "${WEB_THREADS:-4}" \
  --access-logfile - --access-logformat "$access_format"
