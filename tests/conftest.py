"""Shared fixtures: tenants, API keys, an API client that speaks Bearer auth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from ledger.models import IdempotencyClass, Provider, Tenant
from ledger.protocol import services
from tests.support import outbound
from tests.support.outbound import NOWHERE, rule_for


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def tenant(db: Any) -> Tenant:
    return services.tenant_create(slug="acme")


@pytest.fixture
def other_tenant(db: Any) -> Tenant:
    return services.tenant_create(slug="globex")


@pytest.fixture
def provider(tenant: Tenant) -> Provider:
    return services.provider_upsert(
        tenant=tenant, slug="stripe", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
    )


@pytest.fixture
def make_client() -> Callable[..., APIClient]:
    def make(tenant: Tenant, scopes: list[str] | None = None) -> APIClient:
        _, secret = services.apikey_create(tenant=tenant, scopes=scopes or ["read", "write"])
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client

    return make


@pytest.fixture
def api(tenant: Tenant, provider: Provider, make_client: Callable[..., APIClient]) -> APIClient:
    return make_client(tenant)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """pytest-django's test database, and before it is dropped: threads of live servers and
    concurrency tests keep persistent connections; end them, so teardown never fails on
    PostgreSQL. An override rather than an autouse fixture, so a run of tests that need no
    database (the soak, pure functions) never creates one."""
    yield
    with django_db_blocker.unblock():
        if on_postgres():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def outbound_allow(settings: Any) -> Iterator[Callable[..., list[str]]]:
    """The deployment's outbound rules for this test (tests.support.outbound): only the
    "nowhere" address at first; ``outbound_allow(server, "http://127.0.0.1:1234", …)`` adds
    exactly those hosts and ports for the rest of the test."""
    rules = ",".join([NOWHERE, *outbound.standing])
    settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": rules, "OUTBOUND_ALLOW_PUBLIC": True}

    def allow(*targets: Any) -> list[str]:
        added = [rule_for(t) for t in targets]
        rules = [r for r in str(settings.ONCEGUARD.get("OUTBOUND_ALLOW") or "").split(",") if r]
        settings.ONCEGUARD = {**settings.ONCEGUARD, "OUTBOUND_ALLOW": ",".join(dict.fromkeys(rules + added))}
        return added

    # Test servers announce themselves (tests.support.outbound.announce) while this test runs.
    outbound.activate(allow)
    yield allow
    outbound.activate(None)


@pytest.fixture(autouse=True)
def object_dirs(settings: Any, tmp_path: Any) -> dict[str, Any]:
    """Every test stores uploads and outputs (ledger.execution.objects) in folders of its own, so a test
    can look at exactly what was stored — and nothing lands in var/."""
    dirs = {"objects": tmp_path / "objects", "quarantine": tmp_path / "quarantine"}
    storages = dict(settings.STORAGES)
    for alias, folder in (("onceguard_objects", dirs["objects"]), ("onceguard_quarantine", dirs["quarantine"])):
        storages[alias] = {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {**settings.STORAGES[alias].get("OPTIONS", {}), "location": str(folder)},
        }
    settings.STORAGES = storages
    return dirs


@pytest.fixture(autouse=True)
def _forget_process_caches() -> Any:
    """Per-process caches are keyed by ids and test databases reuse ids between tests."""
    from django.core.cache import cache

    from ledger.platform import caching
    from ledger.protocol import selectors

    caching.clear_all()
    selectors._PROVIDER_SLUGS.clear()
    # Django's cache: the dashboard keeps finished hours' activity there, keyed by tenant ids.
    cache.clear()
    yield
    caching.clear_all()
    selectors._PROVIDER_SLUGS.clear()
    cache.clear()


# Suites marked `serial` here run in scripts/test.sh's serial step, after the parallel run
# and one test at a time: the n8n suite's session fixtures install n8n into the machine's
# cache and build one user folder; the browser suite and the Redis broker's may each apt-get
# a missing program (dpkg holds one lock); the soak's timings assume the machine to itself.
# (pytest-xdist's `--dist loadgroup` would keep a group on one worker beside the others, but
# with pytest 9 it no longer tags the items it groups, so the groups scatter.)
SERIAL = ("tests/n8n/", "tests/browser/", "tests/observability/test_redis_broker.py", "tests/soak/")


# What `make test-fast` leaves out (marked `slow` here; `make test` runs all of it): files whose
# tests take seconds each — child processes (workers, web servers, manage.py), crash windows,
# whole-demo walks, whole console pages rendered as every role, the input-boundary sweep,
# schema-wide walks, thread races — and every Hypothesis test (fuzzing). Chosen from per-file
# timings of the fast subset (over 0.5 s a test, or whole-schema checks).
SLOW: tuple[str, ...] = (
    "tests/console/test_accesslog_integrity.py",
    "tests/console/test_config_changes.py",
    "tests/console/test_console_cpu_work.py",
    "tests/console/test_console_fuzz.py",
    "tests/console/test_console_pages.py",
    "tests/console/test_console_rows.py",
    "tests/console/test_console_secrets.py",
    "tests/console/test_history_pages.py",
    "tests/console/test_list_query_counts.py",
    "tests/console/test_no_payload_in_logs.py",
    "tests/console/test_permission_matrix.py",
    "tests/console/test_provider_rollout.py",
    "tests/console/test_quarantine_page.py",
    "tests/console/test_sealed_secrets.py",
    "tests/console/test_security_and_dashboard.py",
    "tests/console/test_tenant_scoping.py",
    "tests/dlq/test_concurrency.py",
    "tests/dlq/test_tenant_columns.py",
    "tests/e2e/",
    "tests/execute/test_adapter_revisions.py",
    "tests/execute/test_async_fault_modes.py",
    "tests/execute/test_async_worker_processes.py",
    "tests/execute/test_metrics.py",
    "tests/execute/test_provider_caps.py",
    "tests/execute/test_record_retry.py",
    "tests/execute/test_send_window.py",
    "tests/execute/test_tenant_secret_namespace.py",
    "tests/execute/test_worker_processes.py",
    "tests/ledger/test_concurrency.py",
    "tests/ledger/test_tenant_columns.py",
    "tests/observability/test_production.py",
    "tests/observability/test_run_all_ready.py",
    "tests/relay/test_testing_api.py",
    "tests/review/test_erasure_objects.py",
    "tests/sweeper/test_sweep_loop.py",
    "tests/test_citus_readiness.py",
    "tests/test_input_boundaries.py",
    "tests/test_local_env.py",
    "tests/test_metrics.py",
    "tests/test_migrations.py",
    "tests/test_readme_walkthrough.py",
    "tests/test_run_all.py",
    "tests/test_serializer_reuse.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy suites (browser, real n8n, soak, fuzzing) and the ``pg_pass`` ones run once per
    `make test`, in the PostgreSQL pass: on SQLite they are skipped, never silently dropped from CI (.ci/run
    fails when the PostgreSQL pass did not happen)."""
    from django.conf import settings

    on_sqlite = "postgresql" not in settings.DATABASES["default"]["ENGINE"]
    skip = pytest.mark.skip(reason="heavy suite: runs once, in the PostgreSQL pass")
    for item in items:
        heavy = (
            item.get_closest_marker("heavy") or item.get_closest_marker("browser") or item.get_closest_marker("pg_pass")
        )
        if heavy and on_sqlite:
            item.add_marker(skip)
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        # A Hypothesis test carries `.hypothesis` (its documented `inner_test` handle).
        if item.nodeid.startswith(SLOW) or hasattr(getattr(item, "obj", None), "hypothesis"):
            item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The order's seed at the end of every run (pytest-randomly prints it only in the header,
    which -q hides), so a failure that depends on the order can be repeated."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.has_plugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(
            f"random order: -p randomly --randomly-seed={seed} repeats it; -p no:randomly keeps file order"
        )
