"""Monthly partitions of attempts and events (DESIGN §12, *Partitions*).

PostgreSQL: ``ledger_attempt`` becomes a table partitioned by range of ``started_at`` and
``ledger_operationevent`` by range of ``at``, each with the primary key ``(id, <time>)`` (a
partitioned table's unique constraints must hold its partition key). The existing table is
kept, renamed ``<table>_legacy`` and attached as the partition of everything before the month
after next; the partitions of that month and the following ones, and a default partition, are
created empty. SQLite: the tables stay plain; only the model state changes below apply.

**Locks.** Everything that reads the rows runs first, without blocking writes: a unique index
on ``(id, <time>)`` built CONCURRENTLY, the indexes the parent declares built CONCURRENTLY
where the old table lacks them, and a ``CHECK (<time> < boundary)`` added NOT VALID and then
validated (SHARE UPDATE EXCLUSIVE: reads and writes go on). The swap is one short transaction
under an ACCESS EXCLUSIVE lock on the old table (``lock_timeout`` 10 s; rerun the migration if
it is not granted): drop the identity of ``id`` (its last value carried over to the new
table's), rename, create the partitioned table and its indexes and foreign keys (instant: no
partition yet), make the ``(id, <time>)`` index the old table's primary key, and ATTACH it —
which uses the validated CHECK instead of scanning and the prebuilt indexes instead of
building. Catalog work only: milliseconds whatever the size, after waiting for the lock.

**What changes for the model.** ``attempt_unique_number`` (operation, number) cannot stay
unique: PostgreSQL enforces uniqueness within a partition only, and the number does not
contain the time. It becomes a plain index; an attempt's number is taken from its operation's
``attempts`` counter by the guarded UPDATE that opens it, under the operation's row lock, so
two attempts of one operation never share a number (DESIGN §3). The models keep ``id`` as
their primary key for Django: Django 5.2's admin refuses to register a model whose primary key
is a ``CompositePrimaryKey`` (django/contrib/admin/sites.py), and the console lists attempts
and events; ids still come from one sequence per table, so ``id`` alone still names one row.
Nothing points at either table by foreign key (checked: DLQ entries, replays and review items
point at operations; an event's ``attempt`` is a number, not a key).

**Reverse** copies the rows into a plain table (a full rewrite under lock): meant for tests
and an emergency, not for a large production table.
"""

from datetime import UTC, datetime
from typing import Any

from django.db import migrations, models

# table → (partition column, indexes the partitioned table gains that the old table lacks).
# Every other index and every foreign key of the old table is read from the catalog and
# declared again on the partitioned table under its own name (the old table's copies, renamed,
# become the legacy partition's: ATTACH pairs them by definition).
TABLES = {
    "ledger_operationevent": ("at", {}),
    "ledger_attempt": ("started_at", {"attempt_op_number_idx": "(operation_id, number)"}),
}
STORAGE = {
    "ledger_attempt": "fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,"
    " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
    "ledger_operationevent": "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
}
MONTHS_AHEAD = 3


def _month(at: datetime, plus: int) -> datetime:
    index = at.year * 12 + at.month - 1 + plus
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def _literal(at: datetime) -> str:
    return f"'{at.isoformat()}'::timestamptz"


def _one(schema_editor: Any, sql: str, params: Any = None) -> Any:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _rows(schema_editor: Any, sql: str, params: Any = None) -> list[Any]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _convert(schema_editor: Any, table: str, boundary: datetime) -> None:
    column, new_indexes = TABLES[table]
    run = schema_editor.execute
    (kind,) = _one(schema_editor, "SELECT relkind FROM pg_class WHERE oid = %s::regclass", [table])
    if kind == "p":
        return  # converted by an earlier, interrupted run
    legacy = f"{table}_legacy"
    pk_index = f"{table}_id_{column}_key"
    # 1. Without blocking writes: the indexes the partition will need, and the CHECK that
    # lets ATTACH skip its scan. An interrupted concurrent build leaves an invalid index: drop
    # it first.
    run(f"DROP INDEX CONCURRENTLY IF EXISTS {pk_index}")
    run(f"CREATE UNIQUE INDEX CONCURRENTLY {pk_index} ON {table} (id, {column})")
    for name, definition in new_indexes.items():
        run(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        run(f"CREATE INDEX CONCURRENTLY {name} ON {table} {definition}")
    run(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_before_partitions")
    # (Literals, not parameters: DDL takes none. The boundary is computed here.)
    run(f"ALTER TABLE {table} ADD CONSTRAINT {table}_before_partitions CHECK ({column} < {_literal(boundary)}) NOT VALID")
    run(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_before_partitions")
    # What the partitioned table declares again: the old table's plain indexes (not its
    # primary key, not a unique constraint) and its foreign keys.
    indexes = _rows(
        schema_editor,
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s::regclass AND NOT i.indisprimary AND NOT i.indisunique",
        [table],
    )
    foreign_keys = _rows(
        schema_editor,
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'",
        [table],
    )
    uniques = _rows(
        schema_editor,
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'u'",
        [table],
    )
    # 2. The swap: catalog changes only, under one short exclusive lock.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute("SET LOCAL lock_timeout = '10s'")
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            (sequence,) = cursor.fetchone()
            cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
            last_value, is_called = cursor.fetchone()
            next_id = last_value + 1 if is_called else last_value
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN id DROP IDENTITY")
            cursor.execute(f"ALTER TABLE {table} RENAME TO {legacy}")
            for name, _ in indexes:
                cursor.execute(f"ALTER INDEX {name} RENAME TO {name[:50]}_legacy")
            cursor.execute(
                f"ALTER TABLE {legacy} DROP CONSTRAINT {table}_pkey,"
                f" ADD CONSTRAINT {legacy}_pkey PRIMARY KEY USING INDEX {pk_index}"
            )
            # Unique constraints cannot hold across partitions (attempt_unique_number: the
            # model says why it is not needed).
            for (name,) in uniques:
                cursor.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {name}")
            cursor.execute(
                f"CREATE TABLE {table} (LIKE {legacy} INCLUDING DEFAULTS INCLUDING STORAGE)"
                f" PARTITION BY RANGE ({column})"
            )
            cursor.execute(
                f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {next_id})"
            )
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id, {column})")
            for name, definition in indexes:
                # "CREATE INDEX x ON public.<table> …": the name now the partitioned table's, which
                # has no partition yet, so this is instant.
                cursor.execute(definition)
            for name, definition in foreign_keys:
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            cursor.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({_literal(boundary)})"
            )
            for plus in range(MONTHS_AHEAD + 1):
                lower = _month(boundary, plus)
                name = f"{table}_p{lower.year:04d}_{lower.month:02d}"
                cursor.execute(
                    f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES FROM ({_literal(lower)})"
                    f" TO ({_literal(_month(boundary, plus + 1))}) WITH ({STORAGE[table]})"
                )
            cursor.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT WITH ({STORAGE[table]})")
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
    # 3. The CHECK is implied by the legacy partition's bound now.
    run(f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS {table}_before_partitions")


def _revert(schema_editor: Any, table: str) -> None:
    column, new_indexes = TABLES[table]
    (kind,) = _one(schema_editor, "SELECT relkind FROM pg_class WHERE oid = %s::regclass", [table])
    if kind != "p":
        return
    indexes = _rows(
        schema_editor,
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = %s::regclass AND NOT i.indisprimary",
        [table],
    )
    foreign_keys = _rows(
        schema_editor,
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = %s::regclass AND contype = 'f' AND conparentid = 0",
        [table],
    )
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}")
            (next_id,) = cursor.fetchone()
            cursor.execute(f"CREATE TABLE {table}_plain (LIKE {table} INCLUDING DEFAULTS INCLUDING STORAGE)")
            cursor.execute(f"INSERT INTO {table}_plain SELECT * FROM {table}")
            cursor.execute(f"DROP TABLE {table}")
            cursor.execute(f"ALTER TABLE {table}_plain RENAME TO {table}")
            cursor.execute(
                f"ALTER TABLE {table} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (START WITH {next_id})"
            )
            cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id)")
            for name, definition in indexes:
                if name not in new_indexes:
                    cursor.execute(definition)
            if table == "ledger_attempt":
                cursor.execute(
                    f"ALTER TABLE {table} ADD CONSTRAINT attempt_unique_number UNIQUE (operation_id, number)"
                )
            for name, definition in foreign_keys:
                cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            cursor.execute(f"ALTER TABLE {table} SET ({STORAGE[table]})")
            cursor.execute("COMMIT")
        except BaseException:
            cursor.execute("ROLLBACK")
            raise


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    (now,) = _one(schema_editor, "SELECT now()")
    # Rows written until the swap must fall below the boundary (the CHECK is enforced on them
    # from the moment it is added): the month after next leaves at least a month.
    boundary = _month(now.astimezone(UTC), 2)
    for table in TABLES:
        _convert(schema_editor, table, boundary)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        _revert(schema_editor, table)


def sqlite_forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        return
    model = apps.get_model("ledger", "Attempt")
    schema_editor.remove_constraint(
        model, models.UniqueConstraint(fields=["operation", "number"], name="attempt_unique_number")
    )
    schema_editor.add_index(model, models.Index(fields=["operation", "number"], name="attempt_op_number_idx"))


def sqlite_backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        return
    model = apps.get_model("ledger", "Attempt")
    schema_editor.remove_index(model, models.Index(fields=["operation", "number"], name="attempt_op_number_idx"))
    schema_editor.add_constraint(
        model, models.UniqueConstraint(fields=["operation", "number"], name="attempt_unique_number")
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0024_open_rows_in_list_order"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="attempt", name="attempt_unique_number"),
                migrations.AddIndex(
                    model_name="attempt",
                    index=models.Index(fields=["operation", "number"], name="attempt_op_number_idx"),
                ),
            ],
            database_operations=[
                migrations.RunPython(sqlite_forwards, sqlite_backwards),
                migrations.RunPython(forwards, backwards),
            ],
        ),
    ]
