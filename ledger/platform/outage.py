"""The database could not be reached: what counts as that, and how a process lets go of a
connection the server has dropped (DESIGN §5 "A blip", §9 errors).

- :func:`database_unavailable` is the one test for it: DB-API's ``OperationalError`` and
  ``InterfaceError`` (a refused or dropped connection, a server shutting down, a transaction
  the server could not process), as Django wraps them or as psycopg raises them, also when
  they are what another error was raised from. The execute worker retries its record step on
  them; the API answers ``503`` + ``Retry-After`` for them.
- :func:`connection_discard` closes this thread's connection, so the next query opens a fresh
  one instead of failing on the dead socket again.
- :func:`dead_connections_discard` closes, before a request uses them, persistent connections
  the server has already closed. An idle connection's socket has nothing to read unless the
  server hung up (EOF, or the FATAL notice of a shutdown), so a zero-timeout poll tells
  without a round trip — unlike ``CONN_HEALTH_CHECKS``, which costs a ``SELECT 1`` per request.
"""

from __future__ import annotations

import contextlib
import select

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections

DATABASE_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
# How far down __cause__/__context__ a wrapped error is looked for.
_CHAIN_DEPTH = 8


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc``, or an error it was raised from, says the database is unreachable."""
    current: BaseException | None = exc
    for _ in range(_CHAIN_DEPTH):
        if current is None:
            return False
        if isinstance(current, DATABASE_UNAVAILABLE_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_after_seconds() -> int:
    """What a client is told to wait while the database is unreachable (``Retry-After``)."""
    return max(1, int(settings.ONCEGUARD.get("DATABASE_RETRY_AFTER_SECONDS", 5)))


def connection_discard(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Close this thread's connection (closing a dead one never raises here); the next query
    connects afresh. Inside a transaction Django only marks it for rollback."""
    with contextlib.suppress(DatabaseError, psycopg.Error):
        connections[alias].close()


def _server_hung_up(raw: psycopg.Connection) -> bool:
    if raw.closed or raw.broken:
        return True
    poller = select.poll()
    poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


def dead_connections_discard() -> int:
    """Close this thread's idle PostgreSQL connections that the server has hung up on (a
    restart, a failover, a network cut the kernel saw); returns how many. Connections in a
    transaction and other databases are left alone."""
    closed = 0
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None or conn.vendor != "postgresql" or conn.in_atomic_block:
            continue
        try:
            dead = _server_hung_up(raw)
        except (OSError, ValueError, psycopg.Error):
            dead = True
        if dead:
            connection_discard(conn.alias)
            closed += 1
    return closed
