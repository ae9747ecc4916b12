"""Framework internals live only in ledger/platform/_adapters/ (docs/adr/0004-private-framework-apis.md):
each one used there still exists and behaves as used — so an upgrade of Django or psycopg that
changes one fails here, by name — and nothing else in the service reaches past a public API."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from ledger.platform._adapters import psycopg_private
from tests.conftest import on_postgres

ROOT = Path(settings.BASE_DIR)
ADAPTERS = "ledger/platform/_adapters/"
SERVICE_PACKAGES = ("config", "ledger", "dlq", "review", "alerts", "observability", "relay")
FRAMEWORKS = ("django", "rest_framework", "psycopg", "django_q", "drf_spectacular")
# Public despite the underscore: Django's documented Model._meta API and default managers,
# and os._exit (a forked worker's exit without cleanup).
PUBLIC_UNDERSCORED = {"_meta", "_default_manager", "_base_manager", "_exit"}
# (Attributes this project puts on objects are named _onceguard_….)
# Internals without an underscore, each known to be one (the adapters hold them).
NAMED_INTERNALS = {"atomic_blocks", "wrap_database_errors", "pgresult", "pgconn", "get_connection"}


def _service_modules() -> list[Path]:
    return [
        p
        for package in SERVICE_PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "migrations" not in p.parts and not p.relative_to(ROOT).as_posix().startswith(ADAPTERS)
    ]


def _own_module_names(tree: ast.Module) -> set[str]:
    """Names bound to this project's own modules (their underscored helpers are ours)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in SERVICE_PACKAGES:
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _framework_internals(tree: ast.Module) -> list[tuple[int, str]]:
    own = _own_module_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FRAMEWORKS:
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("_")]
            if node.module.endswith("templatetags.base"):
                found.append((node.lineno, f"from {node.module}"))
        elif isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and (base.id in {"self", "cls"} or base.id in own):
                continue
            if node.attr in NAMED_INTERNALS:
                found.append((node.lineno, node.attr))
            elif (
                node.attr.startswith("_")
                and not node.attr.startswith(("__", "_onceguard"))
                and node.attr not in PUBLIC_UNDERSCORED
            ):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "__dict__" and isinstance(node.ctx, ast.Store):
                found.append((node.lineno, "__dict__[...] ="))
    return found


def test_no_module_outside_the_adapters_reaches_a_framework_internal() -> None:
    found = []
    for path in _service_modules():
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(ROOT)}:{line} {what}" for line, what in _framework_internals(tree)]
    assert found == [], f"use the public API, or move the use into {ADAPTERS} with its measurement: {found}"


def test_the_check_finds_what_it_looks_for() -> None:
    # A test that cannot fail is a defect: each kind of internal is caught.
    source = (
        "from django.contrib.admin.templatetags.admin_list import _coerce_field_name\n"
        "from django.contrib.admin.templatetags.base import InclusionAdminNode\n"
        "from django.db import connection\n"
        "depth = len(connection.atomic_blocks)\n"
        "columns = cursor.pgresult\n"
        "fields = child._readable_fields\n"
        "paginator.__dict__['count'] = 1\n"
        "ok = (model._meta, self._own, os._exit)\n"
    )
    found = {what for _, what in _framework_internals(ast.parse(source))}
    assert found == {
        "import _coerce_field_name",
        "from django.contrib.admin.templatetags.base",
        "atomic_blocks",
        "pgresult",
        "_readable_fields",
        "__dict__[...] =",
    }


# --- psycopg: each internal psycopg_private uses ---------------------------------------------


@pytest.mark.skipif(not on_postgres(), reason="psycopg's result is PostgreSQL's")
@pytest.mark.django_db
def test_psycopg_result_columns_are_the_statements_in_order() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 AS id, 'x' AS key, now() AS \"updatedAt\"")
        assert psycopg_private.result_columns(cursor) == ("id", "key", "updatedAt")
        assert psycopg_private.result_columns(cursor) == tuple(c.name for c in cursor.description)


# --- What the public replacements must keep equal -------------------------------------------


def test_the_console_column_class_is_djangos() -> None:
    from django.contrib.admin.templatetags import admin_list

    from review.console import listing

    def shown(obj: Any) -> str:
        return ""

    for name, index in (("status", 0), (shown, 3), (lambda obj: obj, 7)):
        # Django's own helper is private: compared here, used nowhere else.
        assert listing._column_name(name, index) == admin_list._coerce_field_name(name, index)


@pytest.mark.django_db
def test_a_missing_review_item_redirects_to_the_index_with_djangos_message(client: Any) -> None:
    from django.contrib.auth.models import User
    from django.contrib.messages import get_messages
    from django.urls import reverse

    client.force_login(User.objects.create_superuser("root", password="correct horse battery"))
    answer = client.get(reverse("admin:review_reviewitem_change", args=[987654]))
    assert answer.status_code == 302 and answer["Location"] == reverse("admin:index")
    assert [str(m) for m in get_messages(answer.wsgi_request)] == [
        "review item with ID “987654” doesn’t exist. Perhaps it was deleted?"
    ]


# --- Django: the instance django_private builds ----------------------------------------------


@pytest.mark.skipif(not on_postgres(), reason="psycopg's result is PostgreSQL's")
@pytest.mark.django_db
def test_psycopg_result_shape_is_the_column_count_and_last_name() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 AS id, 'x' AS key, now() AS \"updatedAt\"")
        assert psycopg_private.result_shape(cursor) == (3, b"updatedAt")


def test_a_loaded_instance_is_what_from_db_builds() -> None:
    from django.db.models import signals

    from ledger.models import Tenant
    from ledger.platform._adapters import django_private

    fields = Tenant._meta.concrete_fields
    attnames = [f.attname for f in fields]
    values = [getattr(Tenant(slug="t", name="T"), name) for name in attnames]
    assert django_private.plain_fields(Tenant, attnames)
    built = django_private.loaded_instance(Tenant, "default", attnames, values, plain=True)
    framework = Tenant.from_db("default", attnames, values)
    assert vars(built).keys() == vars(framework).keys()
    assert all(getattr(built, name) == getattr(framework, name) for name in attnames)
    assert (
        (built._state.adding, built._state.db) == (framework._state.adding, framework._state.db) == (False, "default")
    )
    # A post_init receiver must see its instances: then from_db itself builds them.
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    signals.post_init.connect(receiver, sender=Tenant)
    try:
        django_private.loaded_instance(Tenant, "default", attnames, values, plain=True)
    finally:
        signals.post_init.disconnect(receiver, sender=Tenant)
    assert len(seen) == 1


@pytest.mark.skipif(not on_postgres(), reason="psycopg's loaders are PostgreSQL's")
@pytest.mark.django_db
def test_times_read_by_the_c_loader_are_djangos() -> None:
    from datetime import UTC, datetime

    import psycopg
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    connection.ensure_connection()
    assert psycopg_private.timestamps_loaded_in_c(connection)
    sql = "SELECT TIMESTAMPTZ '2026-12-07 19:59:01.123456+00', TIMESTAMPTZ '2026-06-01 00:00:00+02', now()"
    with connection.cursor() as cursor:
        cursor.execute(sql)
        ours = cursor.fetchone()
        loader = cursor.cursor.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)
        assert loader.__module__ == psycopg_private.__name__
    raw = connection.connection.cursor()
    register_tzloader(connection.timezone, raw)  # Django's own loader, on this cursor only
    raw.execute(sql)
    djangos = raw.fetchone()
    assert (
        ours[:2]
        == djangos[:2]
        == (datetime(2026, 12, 7, 19, 59, 1, 123456, tzinfo=UTC), datetime(2026, 5, 31, 22, tzinfo=UTC))
    )
    assert all(value.tzinfo is UTC for value in (*ours, *djangos))
