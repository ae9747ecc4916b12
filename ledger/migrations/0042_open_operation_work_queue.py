"""The work queue as its own table (ADR 0017): ``ledger_open_operation``, one row per open
operation, written by triggers in the statement that writes the operation row; the ten
indexes of ``ledger_operation`` that named a column the completion changes (ADR 0011 rows 4,
6–8, 10–15) leave it, so the completion is a HOT update.

Safe on a live 10M-row table, in this order, not atomic (each step its own short transaction):
1. The new table and its indexes: created empty, no lock on ``ledger_operation``. Storage
   parameters: ``fillfactor`` 70 (a heartbeat or a move between open states updates the row in
   its page), autovacuum after 1,000 dead rows whatever the table's size, with no cost delay
   (a queue's dead rows are vacuumed while they are few), statistics after 1,000 changes
   (ADR 0010).
2. The triggers: ``CREATE OR REPLACE TRIGGER`` takes a SHARE ROW EXCLUSIVE lock on
   ``ledger_operation`` for an instant (under ``lock_timeout``; it waits for the writes under
   way, blocks new ones only while it waits, never reads). From then on every write keeps the
   mirror. A run again after a failure replaces them (``ledger.store.open_rows``).
3. The backfill of the rows open before that (``ledger.store.open_rows``): batches of 10,000
   ids, each locking its open rows under a 2 s ``lock_timeout``, retried. The open rows are
   found through ``op_open_id_idx`` (still there at this step): the work under way, tens of
   thousands at 10M rows, not the table — so the migration fills them itself; no watermark and
   no reads from a half-filled table (the code that reads the mirror is deployed with this
   migration, after it). ``manage.py open_rows_backfill`` runs the same batches again (a repair,
   resumable from an id).
4. The terminal events' two partial indexes (``opevent_terminal_status_idx`` for lists by a
   terminal state, ``opevent_terminal_at_idx`` for ``updated_after``): per partition
   ``CONCURRENTLY``, attached to the parent's (as migration 0035).
5. The ten indexes dropped ``CONCURRENTLY``.
Reversible: backwards recreates the ten ``CONCURRENTLY`` (from the definitions below), drops the
event indexes, the triggers and the table.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

from ledger.store import open_rows

TABLE = "ledger_open_operation"
STORAGE = (
    "fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,"
    " autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 1000,"
    " autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000,"
    " autovacuum_vacuum_cost_delay = 0"
)

# The dropped indexes as they were (pg_indexes of a database at migration 0041), for backwards.
DROPPED = {
    "op_claimed_lease_idx": "(status, lease_expires_at) WHERE status = 'claimed'",
    "op_due_idx": "(status, next_attempt_at) WHERE status IN ('queued', 'retry_wait')",
    "op_unresolved_idx": "(status, updated_at) WHERE status IN ('uncertain', 'review')",
    "op_tenant_updated_idx": "(tenant_id, updated_at, id)",
    "op_exec_due_idx": "(next_attempt_at, id) WHERE mode = 'execute' AND status IN ('queued', 'retry_wait')",
    "op_exec_inflight_idx": "(provider_id) WHERE mode = 'execute' AND status = 'claimed'",
    "op_waiting_due_idx": "(next_attempt_at, id) WHERE status = 'waiting'",
    "op_tenant_other_status_idx": "(tenant_id, status, id) WHERE NOT status = 'succeeded'",
    "op_open_id_idx": "(id, updated_at) WHERE NOT status IN ('abandoned', 'failed', 'succeeded')",
    "op_cancellable_id_idx": "(id) WHERE status IN ('queued', 'retry_wait')",
}

EVENTS = "ledger_operationevent"
# Lists by a terminal state but `succeeded` (which reads (tenant, id)), newest operation first.
# Terminal states are final, so an operation's event into one names its state for good.
EVENT_INDEXES = {
    "opevent_terminal_status_idx": (
        "_term_status",
        "(tenant_id, to_status, operation_id) WHERE to_status IN ('abandoned', 'failed')",
    ),
    # `updated_after`'s finished rows: a finished row's updated_at is the time of its last
    # event into a terminal state (its terminal move, or a supersede), written in the same
    # transaction.
    "opevent_terminal_at_idx": (
        "_term_at",
        "(tenant_id, at, operation_id) WHERE to_status IN ('abandoned', 'failed', 'succeeded')",
    ),
}


def _pg(schema_editor: Any) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def storage(apps: Any, schema_editor: Any) -> None:
    if _pg(schema_editor):
        schema_editor.execute(f"ALTER TABLE {TABLE} SET ({STORAGE})")


def triggers(apps: Any, schema_editor: Any) -> None:
    if _pg(schema_editor):
        schema_editor.execute("SET lock_timeout = '5s'")
    open_rows.triggers_install(schema_editor)
    if _pg(schema_editor):
        schema_editor.execute("RESET lock_timeout")


def untriggers(apps: Any, schema_editor: Any) -> None:
    open_rows.triggers_remove(schema_editor)


def backfill(apps: Any, schema_editor: Any) -> None:
    open_rows.open_rows_backfill()


def _partitions(schema_editor: Any) -> list[str]:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
            [EVENTS],
        )
        return [row[0] for row in cursor.fetchall()]


def _valid(schema_editor: Any, name: str) -> bool | None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def _attached(schema_editor: Any, child: str, parent: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_inherits WHERE inhrelid = to_regclass(%s) AND inhparent = to_regclass(%s)",
            [child, parent],
        )
        return cursor.fetchone() is not None


def event_indexes(apps: Any, schema_editor: Any) -> None:
    for name, (suffix, definition) in EVENT_INDEXES.items():
        if not _pg(schema_editor):
            schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {EVENTS} {definition}")
            continue
        partitions = _partitions(schema_editor)
        if not partitions:
            if _valid(schema_editor, name) is False:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {EVENTS} {definition}")
            continue
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON ONLY {EVENTS} {definition}")
        for partition in partitions:
            child = f"{partition[:50]}{suffix}"
            if _valid(schema_editor, child) is False:
                schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {child}")
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {child} ON {partition} {definition}")
            if not _attached(schema_editor, child, name):
                schema_editor.execute(f"ALTER INDEX {name} ATTACH PARTITION {child}")


def event_indexes_drop(apps: Any, schema_editor: Any) -> None:
    for name in EVENT_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


def drop_old(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY " if _pg(schema_editor) else ""
    for name in DROPPED:
        schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {name}")


def recreate_old(apps: Any, schema_editor: Any) -> None:
    concurrently = "CONCURRENTLY " if _pg(schema_editor) else ""
    for name, definition in DROPPED.items():
        schema_editor.execute(f"CREATE INDEX {concurrently}IF NOT EXISTS {name} ON ledger_operation {definition}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0041_approval_requests"),
    ]

    operations = [
        migrations.CreateModel(
            name="OpenOperation",
            fields=[
                (
                    "operation",
                    models.OneToOneField(
                        db_column="id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="open_row",
                        serialize=False,
                        to="ledger.operation",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "queued"),
                            ("claimed", "claimed"),
                            ("retry_wait", "retry wait"),
                            ("waiting", "waiting on provider"),
                            ("uncertain", "uncertain"),
                            ("review", "review"),
                            ("succeeded", "succeeded"),
                            ("failed", "failed"),
                            ("abandoned", "abandoned"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "mode",
                    models.CharField(
                        choices=[
                            ("guard", "guard (caller performs the effect)"),
                            ("execute", "execute (the service performs the effect)"),
                        ],
                        max_length=8,
                    ),
                ),
                ("lease_expires_at", models.DateTimeField(null=True)),
                ("next_attempt_at", models.DateTimeField(null=True)),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "ledger_open_operation",
            },
        ),
        migrations.AddField(
            model_name="openoperation",
            name="provider",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="ledger.provider",
            ),
        ),
        migrations.AddField(
            model_name="openoperation",
            name="tenant",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="ledger.tenant",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(fields=["tenant", "status", "operation"], name="open_tenant_status_idx"),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("status", "claimed")),
                fields=["status", "lease_expires_at"],
                name="open_claimed_lease_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(fields=["operation", "updated_at"], name="open_id_updated_idx"),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "retry_wait"])),
                fields=["status", "next_attempt_at"],
                name="open_due_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "retry_wait"])),
                fields=["operation"],
                name="open_cancellable_id_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("status__in", ["uncertain", "review"])),
                fields=["status", "updated_at"],
                name="open_unresolved_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("mode", "execute"), ("status", "claimed")),
                fields=["provider"],
                name="open_exec_inflight_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("mode", "execute"), ("status__in", ["queued", "retry_wait"])),
                fields=["next_attempt_at", "operation"],
                name="open_exec_due_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["next_attempt_at", "operation"],
                name="open_waiting_due_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="openoperation",
            index=models.Index(fields=["tenant", "updated_at", "operation"], name="open_tenant_updated_idx"),
        ),
        migrations.AddConstraint(
            model_name="openoperation",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["abandoned", "failed", "succeeded"]), _negated=True),
                name="open_operation_status_open",
            ),
        ),
        migrations.RunPython(storage, migrations.RunPython.noop),
        migrations.RunPython(triggers, untriggers),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(event_indexes, event_indexes_drop),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="operation", name="op_claimed_lease_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_due_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_unresolved_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_tenant_updated_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_exec_due_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_exec_inflight_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_waiting_due_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_tenant_other_status_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_open_id_idx"),
                migrations.RemoveIndex(model_name="operation", name="op_cancellable_id_idx"),
            ],
            database_operations=[migrations.RunPython(drop_old, recreate_old)],
        ),
    ]
