# Onceguard — two commands: `make run` and `make test`. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
PG_URL ?= postgres://postgres@127.0.0.1:5432/test

.PHONY: run test test-fast lint fmt soak bench bench-compare setup clean

## make help: list every target of this Makefile with what it does (these `## make` comments).
.PHONY: help
help:
	@awk '/^## make /{sub(/^## make /, "make "); print; next} /^## /{sub(/^## /, "    "); print}' $(firstword $(MAKEFILE_LIST))

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

## make setup: create .venv (python3.11) and install the pinned requirements-dev.txt; again only when a requirements file changed.
setup: $(VENV)/.installed

## make run: make setup, migrate the embedded SQLite database, seed the demo on first run, then start web + workers +
## schedules + the demo receivers until Ctrl-C (PORT, default 8000; DEMO_PORT_BASE, default 8010; DEMO=0: no demo).
run: setup
	$(PY) manage.py migrate --noinput
	$(PY) manage.py accesslog_key
	PORT=$(PORT) $(PY) manage.py run_all --port $(PORT)

## make lint: ruff check, ruff format --check, lint-imports (the import contracts), make lint-n8n, then make docs.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) --no-print-directory lint-n8n
	$(MAKE) --no-print-directory docs

## make lint-n8n: the n8n node package's own lint (tsc --noEmit, then ESLint with the n8n community-node rules) and build.
.PHONY: lint-n8n
lint-n8n:
	cd integrations/n8n && { test -d node_modules/n8n-workflow || npm ci --loglevel=error; } && npm run lint && npm run build

## make fmt: ruff check --fix and ruff format: rewrite the code in the house format.
fmt: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## make docs: build the docs site (mkdocs.yml, Material theme) into build/site/ with --strict: any warning,
## a broken link or anchor, fails. `.venv/bin/mkdocs serve` serves it with live reload on 127.0.0.1:8001.
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

## make test: lint, the whole suite on SQLite, then on PostgreSQL when reachable (or DATABASE_URL says so),
## each pass on one xdist worker per core, in random order (the seed is printed; TEST_SEED repeats it).
test: lint
	bash scripts/test.sh

## make test-fast: the core of every app on SQLite in under 3 minutes, for use while working: no heavy or
## slow tests (tests/conftest.py's SLOW list), no lint, no PostgreSQL. Its test databases are kept between
## runs (--reuse-db: new migrations are applied); ARGS=--create-db starts them afresh, ARGS adds any.
test-fast: setup
	@started=$$SECONDS; status=0; \
	env -u DATABASE_URL SQLITE_TEST_PATH=$${SQLITE_TEST_PATH:-$(CURDIR)/var/test-fast.sqlite3} \
	  $(PY) -m pytest -q -n $${TEST_WORKERS:-$$(nproc)} --reuse-db -m "not heavy and not browser and not slow" $(ARGS) \
	  || status=$$?; \
	echo "== make test-fast: $$((SECONDS - started)) s, exit $$status =="; exit $$status

## make soak: the whole service on a private PostgreSQL cluster (initdb, own port, removed after) under
## mixed load and random faults for SOAK_SECONDS (600), then its invariants; non-zero exit on a violation.
SOAK_SECONDS ?= 600
soak: setup
	SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m soak

## make bench: every benchmark against PostgreSQL, each beside its baseline measured in the same run, and the
## write cost per operation (WAL, index entries, HOT share, statements, CPU) beside raw SQL; exits non-zero when
## any scenario had errors. BENCH_SUITES narrows it, e.g. `make bench BENCH_SUITES="bench bench.sweeper"`.
BENCH_SUITES ?= bench bench.execute bench.fair bench.sweeper bench.dlq bench.retention bench.fencing bench.tracing bench.powertools
bench: setup
	@set -e; for suite in $(BENCH_SUITES); do \
	  echo; echo "===== $$suite ====="; \
	  DATABASE_URL=$${DATABASE_URL:-$(PG_URL)} $(PY) -m $$suite; \
	done

## make bench-compare OLD=<commit>: that commit against this tree, over HTTP on BENCH_SERVERS
## ((c) fresh and replay, (f) the floor) and in-process ((b)), in BENCH_ROUNDS interleaved rounds.
## `make bench-compare BENCH_SERVERS=granian2x4,2x4,sync4 OLD=` compares servers on this tree alone.
OLD ?= HEAD~1
BENCH_SERVERS ?= granian2x4
BENCH_OLD_TREE ?= /tmp/onceguard-bench-old
bench-compare: setup
	@set -e; trees="--tree new=."; \
	if [ -n "$(OLD)" ]; then \
	  rm -rf $(BENCH_OLD_TREE) && mkdir -p $(BENCH_OLD_TREE); \
	  git archive $(OLD) | tar -x -C $(BENCH_OLD_TREE); \
	  trees="--tree old=$(BENCH_OLD_TREE) $$trees"; \
	fi; \
	DATABASE_URL=$${DATABASE_URL:-$(PG_URL)} $(PY) -m bench.compare $$trees --servers $(BENCH_SERVERS)

## make clean: remove .venv, var/ (the SQLite database, keys, credentials), build/ (the built docs site) and staticfiles/.
clean:
	rm -rf $(VENV) var build staticfiles
