"""/healthz and /readyz: 200 or 503 with a JSON body, answered before host validation,
sessions and auth; liveness never touches the database."""

from __future__ import annotations

import pytest
from django.db.utils import OperationalError
from django.test import Client

from observability import health


def test_healthz_answers_without_the_database_or_a_known_host():
    # No `db` fixture: pytest-django refuses any database access in this test.
    response = Client(HTTP_HOST="10.1.2.3").get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json" and response["Cache-Control"] == "no-store"
    assert response.json() == {"status": "ok"}
    assert "Set-Cookie" not in response and not response.cookies


@pytest.mark.django_db
def test_readyz_is_ready_when_the_database_answers_and_migrations_are_applied():
    response = Client(HTTP_HOST="10.1.2.3").get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "migrations": "ok"}}
    assert not response.cookies


@pytest.mark.django_db
def test_readyz_is_503_when_the_database_does_not_answer(monkeypatch):
    class Broken:
        def cursor(self) -> None:
            raise OperationalError("connection refused to db.internal as onceguard")

    monkeypatch.setattr(health, "connections", {"default": Broken()})
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "checks": {"database": "unreachable: OperationalError"}}
    assert b"db.internal" not in response.content  # the class only, never the message


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_pending(monkeypatch):
    real = health.MigrationExecutor

    class Behind(real):
        def migration_plan(self, targets, clean_start=False):
            return [("ledger", "9999_new"), ("dlq", "9999_new")]

    monkeypatch.setattr(health, "MigrationExecutor", Behind)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "migrations": "2 pending"}


@pytest.mark.django_db
def test_probes_need_no_api_key_or_login_and_refuse_nothing_but_other_methods():
    assert Client().get("/healthz").status_code == 200
    assert Client().head("/readyz").status_code == 200
    assert Client().post("/healthz").status_code == 405
