"""Search off the operation row (ADR 0018) and no foreign-key locks per claim (ADR 0019).

1. ``ledger_operation_search``: the write-once search rows (``OperationSearch``). A new table
   nobody else writes until this migration is done: its indexes are built after the fill
   below (the trigram GIN ``opsearch_text_trgm``, PostgreSQL only, like migration 0028's,
   ``CONCURRENTLY`` all the same).
2. The rows of existing operations: filled here when the operation table is small (at most
   ``FILL_HERE`` rows by the planner's estimate); a larger one is filled live by
   ``manage.py operation_search_backfill`` (batches by id range, each its own short
   transaction with a lock timeout, resumable, idempotent). Both run the same two statements,
   spelled out below so that this migration does not change when the command does.
3. ``op_search_trgm`` (migration 0028) and ``op_ref_idx`` leave ``ledger_operation``:
   ``DROP INDEX CONCURRENTLY`` (no lock on writes; atomic = False) — here when step 2 filled
   every row, else by the backfill command once it has (until then the search reads only the
   rows filled so far: run the command right after deploying).
4. The foreign-key constraints of ``ledger_operation.tenant_id`` and ``provider_id`` are
   dropped (PostgreSQL; ADR 0019): a catalogue change under a 2 s ``lock_timeout``, retried,
   no scan. Django keeps the ``ForeignKey`` (``db_constraint=False``), so PROTECT still refuses
   deleting a tenant or provider with operations. SQLite keeps its deferred constraints (no
   lock contention there; changing them would rebuild the table).

Reversible: the backwards steps rebuild both indexes ``CONCURRENTLY`` and add the constraints
back ``NOT VALID`` and then ``VALIDATE`` them (a SHARE UPDATE EXCLUSIVE lock: writes go on).
"""

import time
from typing import Any

from django.db import migrations, models
from django.db.models import Q
from django.db.utils import OperationalError

# Fill the rows here up to this many operations (the planner's estimate on PostgreSQL).
FILL_HERE = 200_000
BATCH = 5_000
TRGM = "opsearch_text_trgm"
OLD_TRGM = "op_search_trgm"
OLD_TRGM_EXPRESSION = (
    "(UPPER((key || chr(1) || reconciliation_handle || chr(1) || execution_id || chr(1) || correlation_id)::text))"
)
# Django's icontains renders UPPER("text"::text): the index holds the same expression.
TRGM_SQL = (
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {TRGM} ON ledger_operation_search"
    " USING gin ((UPPER(text::text)) gin_trgm_ops) WHERE NOT ref"
)

# The claim's row (its identifiers) and the provider reference of each operation in (after, upto]
# that has none yet: ledger.store.queries.sql operation_search_append, set-wise.
FILL_IDENTIFIERS = """
INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
SELECT o.id,
       COALESCE((SELECT MAX(s.seq) FROM ledger_operation_search s WHERE s.operation_id = o.id), -1) + 1,
       o.tenant_id, FALSE,
       o.key || %(sep)s || o.reconciliation_handle || %(sep)s || o.execution_id || %(sep)s || o.correlation_id
FROM ledger_operation o
WHERE o.id > %(after)s AND o.id <= %(upto)s
  AND NOT EXISTS (
      SELECT 1 FROM ledger_operation_search s WHERE s.operation_id = o.id AND NOT s.ref
        AND s.text = o.key || %(sep)s || o.reconciliation_handle || %(sep)s || o.execution_id || %(sep)s || o.correlation_id)
ON CONFLICT DO NOTHING
"""
FILL_REFS = """
INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
SELECT o.id,
       COALESCE((SELECT MAX(s.seq) FROM ledger_operation_search s WHERE s.operation_id = o.id), -1) + 1,
       o.tenant_id, TRUE, o.provider_ref
FROM ledger_operation o
WHERE o.id > %(after)s AND o.id <= %(upto)s AND o.provider_ref <> ''
  AND NOT EXISTS (
      SELECT 1 FROM ledger_operation_search s WHERE s.operation_id = o.id AND s.ref AND s.text = o.provider_ref)
ON CONFLICT DO NOTHING
"""


def _estimate(schema_editor: Any) -> int:
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute("SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = 'ledger_operation'::regclass")
        else:
            cursor.execute("SELECT COUNT(*) FROM ledger_operation")
        return int(cursor.fetchone()[0])


def fill(schema_editor: Any) -> bool:
    """The search rows of every operation, in id batches; False (nothing done) when the table
    is too large to fill inside a migration."""
    if _estimate(schema_editor) > FILL_HERE:
        return False
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(id), 0) FROM ledger_operation")
        last = int(cursor.fetchone()[0])
        for after in range(0, last, BATCH):
            params = {"after": after, "upto": after + BATCH, "sep": "\x01"}
            cursor.execute(FILL_IDENTIFIERS, params)
            cursor.execute(FILL_REFS, params)
    return True


def _with_lock_timeout(schema_editor: Any, statement: str, attempts: int = 30) -> None:
    """A catalogue change that waits at most 2 s for its lock (never queueing writes behind
    it for longer), retried."""
    for attempt in range(attempts):
        try:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("SET LOCAL lock_timeout = '2s'")
                cursor.execute(statement)
                cursor.execute("COMMIT")
            return
        except OperationalError:
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
            if attempt == attempts - 1:
                raise
            time.sleep(1)


def _foreign_keys(schema_editor: Any) -> list[tuple[str, str]]:
    """(constraint, referenced table) of ledger_operation's tenant and provider constraints."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.conname, c.confrelid::regclass::text FROM pg_constraint c"
            " WHERE c.conrelid = 'ledger_operation'::regclass AND c.contype = 'f'"
            " AND c.confrelid IN ('ledger_tenant'::regclass, 'ledger_provider'::regclass)"
        )
        return [(name, table) for name, table in cursor.fetchall()]


def forwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    filled = fill(schema_editor)
    if vendor == "postgresql":
        # Built after the fill (one build, not an insert per row).
        schema_editor.execute(TRGM_SQL)
        if filled:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {OLD_TRGM}")
            schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS op_ref_idx")
        for name, _ in _foreign_keys(schema_editor):
            _with_lock_timeout(schema_editor, f'ALTER TABLE ledger_operation DROP CONSTRAINT IF EXISTS "{name}"')
    else:
        schema_editor.execute("DROP INDEX IF EXISTS op_ref_idx")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS op_ref_idx ON ledger_operation (provider_ref) WHERE NOT (provider_ref = '')"
        )
        return
    present = {table for _, table in _foreign_keys(schema_editor)}
    for column, table in (("tenant_id", "ledger_tenant"), ("provider_id", "ledger_provider")):
        if table in present:
            continue
        name = f"ledger_operation_{column}_fk_{table}_id"
        _with_lock_timeout(
            schema_editor,
            f'ALTER TABLE ledger_operation ADD CONSTRAINT "{name}" FOREIGN KEY ({column})'
            f" REFERENCES {table} (id) DEFERRABLE INITIALLY DEFERRED NOT VALID",
        )
        schema_editor.execute(f'ALTER TABLE ledger_operation VALIDATE CONSTRAINT "{name}"')
    schema_editor.execute(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS op_ref_idx ON ledger_operation"
        " (provider_ref varchar_pattern_ops) WHERE NOT (provider_ref = '')"
    )
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {OLD_TRGM} ON ledger_operation"
        f" USING gin ({OLD_TRGM_EXPRESSION} gin_trgm_ops)"
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {TRGM}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0042_open_operation_work_queue"),
    ]

    operations = [
        migrations.CreateModel(
            name="OperationSearch",
            fields=[
                ("pk", models.CompositePrimaryKey("operation_id", "seq", blank=True, editable=False, primary_key=True, serialize=False)),
                ("seq", models.PositiveSmallIntegerField()),
                ("ref", models.BooleanField(default=False)),
                ("text", models.TextField()),
                (
                    "operation",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="search_rows",
                        to="ledger.operation",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.DO_NOTHING,
                        related_name="+",
                        to="ledger.tenant",
                    ),
                ),
            ],
            options={
                "db_table": "ledger_operation_search",
                "indexes": [
                    models.Index(fields=["tenant", "operation"], name="opsearch_tenant_op_idx"),
                    models.Index(
                        condition=Q(("ref", True)),
                        fields=["text"],
                        name="opsearch_ref_idx",
                        opclasses=["text_pattern_ops"],
                    )
                ],
            },
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="operation", name="op_ref_idx"),
                migrations.AlterField(
                    model_name="operation",
                    name="provider",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=models.deletion.PROTECT,
                        related_name="operations",
                        to="ledger.provider",
                    ),
                ),
                migrations.AlterField(
                    model_name="operation",
                    name="tenant",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=models.deletion.PROTECT,
                        related_name="operations",
                        to="ledger.tenant",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
