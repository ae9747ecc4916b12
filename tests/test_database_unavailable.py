"""While the database is unreachable every request answers 503 + Retry-After — problem+json
`database_unavailable` under /api/ — never 500, wherever in the request the error comes
from; and a persistent connection the server hung up on is dropped before it is used (issue
11 item 7). The outage is simulated here; the real one (a TCP proxy cut in front of
PostgreSQL, a web server restored without restart) is tests/e2e/test_database_outage.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import InterfaceError, OperationalError, connection, connections
from django.test import Client

from config import problems
from ledger.platform.outage import database_unavailable, dead_connections_discard
from ledger.protocol import transitions
from ledger.tenants import auth
from observability import health
from tests.ledger.support import CLAIM_URL, claim_body

pytestmark = pytest.mark.django_db

# What a driver says when the server is gone, host and user included: never echoed.
MESSAGE = 'connection to server at "db.internal" (10.0.0.5), port 5432 failed: FATAL: role "onceguard"'


def unreachable(*args: Any, **kwargs: Any) -> Any:
    raise OperationalError(MESSAGE)


def assert_database_unavailable(response: Any) -> None:
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "5" and response["Cache-Control"] == "no-store"
    body = json.loads(response.content)
    assert (body["status"], body["code"]) == (503, "database_unavailable")
    assert b"db.internal" not in response.content and b"10.0.0.5" not in response.content


@pytest.mark.parametrize(
    "error", [OperationalError(MESSAGE), InterfaceError(MESSAGE), psycopg.OperationalError(MESSAGE)]
)
def test_a_claim_while_the_database_is_unreachable_answers_503_with_retry_after(api, monkeypatch, error):
    def fail(**kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(transitions, "operation_claim", fail)
    assert_database_unavailable(api.post(CLAIM_URL, claim_body(key="blip:1"), format="json"))


def test_the_api_key_lookup_failing_on_the_database_is_503_not_401(api, monkeypatch):
    monkeypatch.setattr(auth, "_load_principal", unreachable)
    assert_database_unavailable(api.get("/api/v1/operations"))


def test_an_error_raised_from_a_database_error_is_503_too(api, monkeypatch):
    def wrapped(**kwargs: Any) -> Any:
        try:
            unreachable()
        except OperationalError as exc:
            raise RuntimeError("while recording") from exc

    monkeypatch.setattr(transitions, "operation_claim", wrapped)
    assert_database_unavailable(api.post(CLAIM_URL, claim_body(key="blip:2"), format="json"))


def test_other_errors_stay_500_internal_error(api, monkeypatch):
    def bug(**kwargs: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(transitions, "operation_claim", bug)
    response = api.post(CLAIM_URL, claim_body(key="blip:3"), format="json")
    assert response.status_code == 500 and response.json()["code"] == "internal_error"
    assert "Retry-After" not in response


def test_outside_drf_a_console_request_whose_session_cannot_be_read_is_503(monkeypatch):
    # The session middleware reads the database before any view: Django's handler500 path.
    monkeypatch.setattr(SessionStore, "load", unreachable)
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "x" * 32
    response = client.get("/admin/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response["Content-Type"].startswith("text/html") and b"db.internal" not in response.content


def test_outside_drf_an_api_path_gets_problem_json(rf):
    request = rf.get("/api/v1/not-a-drf-view")
    try:
        unreachable()
    except OperationalError:
        response = problems.handler500(request)
    assert_database_unavailable(response)
    try:
        raise ValueError("a bug")
    except ValueError:
        assert problems.handler500(request).status_code == 500


def test_readyz_503_carries_the_same_retry_after(monkeypatch):
    class Broken:
        def cursor(self) -> None:
            unreachable()

    monkeypatch.setattr(health, "connections", {"default": Broken()})
    response = Client().get("/readyz")
    assert response.status_code == 503 and response["Retry-After"] == "5"


def test_what_counts_as_unreachable():
    assert database_unavailable(OperationalError("x")) and database_unavailable(psycopg.InterfaceError("x"))
    assert not database_unavailable(ValueError("x"))
    chained = RuntimeError("outer")
    chained.__cause__ = OperationalError("inner")
    assert database_unavailable(chained)
    # A cycle in the chain ends the walk.
    looped = RuntimeError("a")
    looped.__context__ = looped
    assert not database_unavailable(looped)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_an_idle_connection_the_server_hung_up_on_is_dropped_before_use():
    if connection.vendor != "postgresql":
        pytest.skip("persistent PostgreSQL connections")
    ready, hung_up, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def web_thread() -> None:
        # A thread of its own, as a web server's: its own persistent connection.
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                seen["pid"] = cursor.fetchone()[0]
            # A live idle connection is left alone.
            seen["live"] = dead_connections_discard()
            ready.set()
            hung_up.wait(10)
            seen["dropped"] = 0
            for _ in range(50):  # the server's FATAL notice and EOF arrive within milliseconds
                seen["dropped"] = dead_connections_discard()
                if seen["dropped"]:
                    break
                done.wait(0.02)
            with connection.cursor() as cursor:  # a fresh connection, no error
                cursor.execute("SELECT 1")
                seen["after"] = cursor.fetchone()[0]
        finally:
            connections.close_all()
            ready.set()

    worker = threading.Thread(target=web_thread)
    worker.start()
    assert ready.wait(10) and "pid" in seen
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [seen["pid"]])
    hung_up.set()
    worker.join(15)
    assert (seen["live"], seen["dropped"], seen["after"]) == (0, 1, 1), seen


def test_on_sqlite_nothing_is_dropped():
    if connection.vendor == "postgresql":
        pytest.skip("SQLite has no server to hang up")
    connection.ensure_connection()
    assert dead_connections_discard() == 0 and connection.connection is not None
