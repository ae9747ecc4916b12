"""Attempts and events keyed ``(id, started_at)`` / ``(id, at)`` in Django too, through
Django 5.2's ``CompositePrimaryKey`` (DESIGN §12, *Partitions*).

**On PostgreSQL, state only: nothing is rewritten, scanned or locked.** (SQLite: one UPDATE of
the time text, below.)

* PostgreSQL already has these keys: migration 0025 made both tables partitioned by month with
  primary keys ``(id, started_at)`` and ``(id, at)``, and ``id`` an identity column. This
  migration tells Django so. It runs no SQL: on an existing database of ten million rows it
  neither rewrites nor scans the partitioned tables, nor takes a lock on them.
* ``id`` stops being Django's AutoField (fields.E100 allows one only as the whole primary key)
  and becomes a ``BigIntegerField`` whose ``db_default`` is ``NewRowId``: Django inserts
  ``DEFAULT`` on PostgreSQL — the column's identity, the same sequence the raw statements of
  ``ledger/store/queries.sql`` draw from — and returns the id with ``RETURNING``. The expression is
  not written to the database as a column default (an identity column has its own; PostgreSQL
  refuses both).
* SQLite keeps its plain tables with ``id integer PRIMARY KEY AUTOINCREMENT``: a rowid alias,
  the only way SQLite numbers a row without the insert naming the id (a column default cannot
  read the table), which the raw statements rely on. ``NewRowId`` compiles to NULL there, which
  asks for the next rowid. An id unique by itself makes ``(id, <time>)`` unique too, so the key
  Django declares holds on SQLite as well, without a table rebuild. What SQLite does need: its
  times compared as text. The raw statements wrote ``now()`` with three digits of fraction
  (``…:04.710``) where Django writes six (``…:04.710000``), so a key read back would not find
  its row (``filter(pk=…)``, ``refresh_from_db``). The statements now write Django's form
  (ledger.store.statements), and the SQLite step below rewrites the times already written in the old
  one — on SQLite only (development and test databases), never on PostgreSQL.

Nothing points at either table by foreign key (DLQ entries, replays, review items and outputs
point at operations; an event's ``attempt`` is a number), so no other table changes.
"""

from typing import Any

from django.db import migrations, models

import ledger.models

# Column → the SQLite text it holds in the raw statements' old form (`YYYY-MM-DD HH:MM:SS.fff`,
# 23 characters) rewritten in Django's: six digits of fraction, none when they are all zero.
SQLITE_TIMES = {"ledger_attempt": "started_at", "ledger_operationevent": "at"}


def sqlite_times_as_django_writes_them(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    for table, column in SQLITE_TIMES.items():
        schema_editor.execute(
            f"UPDATE {table} SET {column} = CASE WHEN substr({column}, 21) = '000'"
            f" THEN substr({column}, 1, 19) ELSE {column} || '000' END"
            f" WHERE length({column}) = 23"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0029_tenant_on_attempts_events_rates"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="id",
                    field=models.BigIntegerField(db_default=ledger.models.NewRowId("ledger_attempt")),
                ),
                migrations.AddField(
                    model_name="attempt",
                    name="pk",
                    field=models.CompositePrimaryKey(
                        "id", "started_at", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                migrations.AlterField(
                    model_name="operationevent",
                    name="id",
                    field=models.BigIntegerField(db_default=ledger.models.NewRowId("ledger_operationevent")),
                ),
                migrations.AddField(
                    model_name="operationevent",
                    name="pk",
                    field=models.CompositePrimaryKey(
                        "id", "at", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(sqlite_times_as_django_writes_them, migrations.RunPython.noop),
    ]
