"""Attempts, events and providers' rate buckets gain ``tenant_id`` (DESIGN §12,
*Past one primary: Citus*).

Citus distributes every tenant-owned table by ``tenant_id``, co-located, and runs a statement on
one node only when it names the tenant: so the child tables carry their operation's (their
provider's) tenant, and every statement on them names it. The column is copied from the parent
here and written by every insert from now on.

**Locks, on PostgreSQL** (attempts and events are monthly-partitioned since 0025 and may hold
tens of millions of rows; each step below covers every partition):

1. ``ADD COLUMN tenant_id bigint`` (nullable, no default): catalog only, no rewrite, no scan —
   an ACCESS EXCLUSIVE lock held for milliseconds, asked for with ``lock_timeout`` 10 s (a long
   transaction on the table would otherwise queue every reader behind the request; rerun the
   migration if it is not granted).
2. The backfill copies the parent's tenant in batches of ``BATCH`` ids, each its own short
   transaction holding ROW EXCLUSIVE (row locks on the batch only: reads and writes go on).
   Each batch writes a new version of its rows (the table grows by the rows' size until
   autovacuum reclaims the old versions; attempts keep their fillfactor-90 room for HOT).
   Rows an older release writes meanwhile without the column are caught by a last pass over
   the ids the first pass did not reach.
3. ``CHECK (tenant_id IS NOT NULL) NOT VALID`` (ACCESS EXCLUSIVE for milliseconds, no scan),
   then ``VALIDATE CONSTRAINT``: the scan, under SHARE UPDATE EXCLUSIVE — reads and writes go
   on. From step 3 on, a write without the column is refused: run this with the writers of this
   release (or stop the old ones first).
4. ``SET NOT NULL``: PostgreSQL sees the validated CHECK and skips its scan (ACCESS EXCLUSIVE
   for milliseconds, again with ``lock_timeout``); then the CHECK is dropped.

No foreign key to the tenant on attempts and events: a partitioned table refuses ``NOT VALID``
foreign keys, so adding one would scan every row under a lock that stops writes, and the
operation's key already ties each row to its tenant (the Citus migration widens it to
``(tenant_id, operation_id) → (tenant_id, id)``). The rate buckets (one row per capped
provider) get theirs. SQLite: the same columns and copies, in one go.
"""

from typing import Any

from django.db import migrations, models, transaction

from ledger.platform.backfill import backfill_in_batches

BATCH = 10_000
# table → the statement that copies the parent's tenant into a range of ids.
TABLES = {
    "ledger_attempt": (
        "UPDATE ledger_attempt SET tenant_id = o.tenant_id FROM ledger_operation o"
        " WHERE o.id = ledger_attempt.operation_id AND ledger_attempt.id >= %s AND ledger_attempt.id < %s"
        " AND ledger_attempt.tenant_id IS NULL"
    ),
    "ledger_operationevent": (
        "UPDATE ledger_operationevent SET tenant_id = o.tenant_id FROM ledger_operation o"
        " WHERE o.id = ledger_operationevent.operation_id"
        " AND ledger_operationevent.id >= %s AND ledger_operationevent.id < %s"
        " AND ledger_operationevent.tenant_id IS NULL"
    ),
}
RATES = (
    "UPDATE ledger_providerrate SET tenant_id = p.tenant_id FROM ledger_provider p"
    " WHERE p.id = ledger_providerrate.provider_id AND ledger_providerrate.tenant_id IS NULL"
)


def add_columns(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor != "postgresql":
            for table in (*TABLES, "ledger_providerrate"):
                cursor.execute(f"ALTER TABLE {table} ADD COLUMN tenant_id bigint NULL")
            return
        for table in (*TABLES, "ledger_providerrate"):
            with transaction.atomic(using=schema_editor.connection.alias):
                cursor.execute("SET LOCAL lock_timeout = '10s'")
                cursor.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS tenant_id bigint NULL")


def drop_columns(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        for table in (*TABLES, "ledger_providerrate"):
            cursor.execute(f"ALTER TABLE {table} DROP COLUMN tenant_id")


def backfill(apps: Any, schema_editor: Any) -> None:
    """The parent's tenant into every row, a range of ids per transaction; then the ids written
    meanwhile (by a release that does not write the column yet)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(RATES)
    backfill_in_batches(schema_editor, TABLES, BATCH)


def require(apps: Any, schema_editor: Any) -> None:
    """PostgreSQL: a validated CHECK, so SET NOT NULL (the next operation) skips its scan."""
    if schema_editor.connection.vendor != "postgresql":
        return
    connection = schema_editor.connection
    for table in (*TABLES, "ledger_providerrate"):
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '10s'")
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_tenant_id_set")
            cursor.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {table}_tenant_id_set CHECK (tenant_id IS NOT NULL) NOT VALID"
            )
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_tenant_id_set")
    # SET NOT NULL (AlterField, next) asks for its short exclusive lock with the same patience.
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")


def release(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
        for table in (*TABLES, "ledger_providerrate"):
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_tenant_id_set")


def _tenant(*, constrained: bool, null: bool) -> models.ForeignKey:
    if constrained:
        return models.ForeignKey(
            null=null,
            on_delete=models.deletion.CASCADE,
            related_name="+",
            db_index=False,
            to="ledger.tenant",
        )
    return models.ForeignKey(
        null=null,
        on_delete=models.deletion.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
        to="ledger.tenant",
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0028_one_search_trigram_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField("attempt", "tenant", _tenant(constrained=False, null=True)),
                migrations.AddField("operationevent", "tenant", _tenant(constrained=False, null=True)),
                migrations.AddField("providerrate", "tenant", _tenant(constrained=False, null=True)),
            ],
            database_operations=[migrations.RunPython(add_columns, drop_columns)],
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(require, release),
        migrations.AlterField("attempt", "tenant", _tenant(constrained=False, null=False)),
        migrations.AlterField("operationevent", "tenant", _tenant(constrained=False, null=False)),
        # The rate bucket's key to its tenant: a small table (one row per capped provider).
        migrations.AlterField("providerrate", "tenant", _tenant(constrained=True, null=False)),
        migrations.RunPython(release, require),
    ]
