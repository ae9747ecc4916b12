"""The database's half of the secret-namespace rule (ADR 0001): no tenant's secret namespace
is a prefix of another's. UNIQUE and a CHECK (``[A-Z0-9]{1,32}``) are declared on the model;
"prefix of another row" is not a single-row CHECK, so a trigger holds it, on PostgreSQL and
on SQLite alike. Installed by migration ledger.0032 and again after every ``migrate``: SQLite
rebuilds a table to alter it, and the rebuild drops the table's triggers.

A violation is an ``IntegrityError`` (PostgreSQL: SQLSTATE 23514, check_violation; SQLite:
``RAISE(ABORT)``, a constraint error), the same class the UNIQUE and CHECK raise.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

TRIGGER = "ledger_tenant_namespace_not_prefix"
# No quote in it: it is spliced into the statements' SQL.
MESSAGE = "secret namespace overlaps another tenant namespace (one is a prefix of the other)"

# Any constant shared by every writer: serialises the check-then-insert of two concurrent
# tenant creations, which under READ COMMITTED would not see each other's uncommitted row.
_LOCK_KEY = 7_041_932_032

_POSTGRESQL_INSTALL = [
    f"""
    CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
        PERFORM pg_advisory_xact_lock({_LOCK_KEY});
        -- A new statement after the lock: it sees every tenant committed meanwhile.
        IF EXISTS (
            SELECT 1 FROM ledger_tenant t
            WHERE t.id <> NEW.id
              AND t.secret_namespace <> NEW.secret_namespace
              AND (starts_with(NEW.secret_namespace, t.secret_namespace)
                   OR starts_with(t.secret_namespace, NEW.secret_namespace))
        ) THEN
            RAISE EXCEPTION '{MESSAGE}: %', NEW.secret_namespace USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END
    $body$
    """,
    # CREATE OR REPLACE (PostgreSQL 14+): SHARE ROW EXCLUSIVE, which the reads of every request
    # do not wait on; DROP TRIGGER would take ACCESS EXCLUSIVE on the tenants table.
    f"""
    CREATE OR REPLACE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OF secret_namespace ON ledger_tenant
    FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()
    """,
]
_POSTGRESQL_DROP = [f"DROP TRIGGER IF EXISTS {TRIGGER} ON ledger_tenant", f"DROP FUNCTION IF EXISTS {TRIGGER}()"]

# Equal namespaces are left to the UNIQUE index (its own, clearer error).
_SQLITE_OVERLAP = """
    t.secret_namespace <> NEW.secret_namespace
    AND (substr(NEW.secret_namespace, 1, length(t.secret_namespace)) = t.secret_namespace
         OR substr(t.secret_namespace, 1, length(NEW.secret_namespace)) = NEW.secret_namespace)
"""
_SQLITE_INSTALL = [
    f"""
    CREATE TRIGGER IF NOT EXISTS {TRIGGER}_insert BEFORE INSERT ON ledger_tenant
    FOR EACH ROW WHEN EXISTS (SELECT 1 FROM ledger_tenant t WHERE {_SQLITE_OVERLAP})
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
    f"""
    CREATE TRIGGER IF NOT EXISTS {TRIGGER}_update BEFORE UPDATE OF secret_namespace ON ledger_tenant
    FOR EACH ROW WHEN EXISTS (SELECT 1 FROM ledger_tenant t WHERE t.id <> OLD.id AND {_SQLITE_OVERLAP})
    BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END
    """,
]
_SQLITE_DROP = [f"DROP TRIGGER IF EXISTS {TRIGGER}_insert", f"DROP TRIGGER IF EXISTS {TRIGGER}_update"]


def _run(connection: Any, statements: list[str]) -> None:
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def namespace_triggers_install(connection: Any) -> None:
    """Creates (or replaces) the trigger on ``connection``'s database; idempotent."""
    if connection.vendor == "postgresql":
        _run(connection, _POSTGRESQL_INSTALL)
    elif connection.vendor == "sqlite":
        _run(connection, _SQLITE_INSTALL)


def namespace_triggers_drop(connection: Any) -> None:
    if connection.vendor == "postgresql":
        _run(connection, _POSTGRESQL_DROP)
    elif connection.vendor == "sqlite":
        _run(connection, _SQLITE_DROP)


def namespace_triggers_ensure(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate: the trigger exists once the tenant table has its namespace column (a
    database migrated only part of the way, before ledger.0032, has neither)."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if "ledger_tenant" not in connection.introspection.table_names(cursor):
            return
        columns = {c.name for c in connection.introspection.get_table_description(cursor, "ledger_tenant")}
        if "secret_namespace" not in columns:
            return
        if connection.vendor == "postgresql":
            # PostgreSQL keeps triggers through ALTER TABLE: only a missing one is made (no
            # lock on the tenant table at every deploy).
            cursor.execute(
                "SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = 'ledger_tenant'::regclass", [TRIGGER]
            )
            if cursor.fetchone():
                return
    namespace_triggers_install(connection)
