"""Cheaper growth: fewer index entries per operation, HOT updates where an
update changes no indexed column, and autovacuum settings for the ledger's three big tables.

Index changes (DESIGN §12, *Cheaper growth*, has the table of every index and its reader):

- ``op_tenant_status_id_idx`` (tenant, status, id) → ``op_tenant_other_status_idx``, the same
  columns for every state but ``succeeded``. Each completion inserted its row in the middle of
  the old index (the tenant's `succeeded` run is followed by other states), splitting pages
  half full: 2.2× the size of (tenant, id) at 10M. Succeeded rows are ~98 % of a tenant's, so
  a ``status=succeeded`` list reads (tenant, id) backwards and keeps nearly every row.
- ``op_tenant_created_idx`` (tenant, created_at) → ``op_exec_created_idx``, partial on execute
  mode: only admission's budget reads it, and only for execute-mode rows.
- ``attempt_revision_idx`` (revision, finished_at) → ``attempt_revision_start_idx`` (revision,
  started_at): finished_at being indexed made every attempt's completion non-HOT (a column in
  any index, its predicate included, blocks HOT), guard-mode attempts too.
- ``opevent_op_at_idx`` (operation, at) → ``opevent_op_idx`` (operation): one column, so an
  operation's events deduplicate into one index entry.

Storage parameters (PostgreSQL only; ``ALTER TABLE … SET`` takes a SHARE UPDATE EXCLUSIVE
lock, which does not block reads or writes, and rewrites nothing — fillfactor applies to pages
filled from now on):

- fillfactor 90 on operations and attempts: an update that changes no indexed column (the sent
  marker, an attempt's completion) finds room on its row's page and is HOT — no new index
  entry, the old version pruned in place. Events are never updated: 100.
- autovacuum: the default thresholds (20 % of the table dead, or 20 % inserted) mean a vacuum
  of a 100M-row table every 20M completions; the ledger's tables are vacuumed after 2 % dead
  (operations, attempts) and after 5 % inserted (all three: keeps the visibility map current
  for index-only scans and freezes rows in smaller passes), analysed after 2 % changed.

Indexes are built and dropped CONCURRENTLY on PostgreSQL (no lock on writes while a large
table is indexed), so this migration is not atomic; elsewhere the schema editor's plain DDL.
"""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

# (model, old index, new index)
CHANGES = [
    (
        "operation",
        models.Index(fields=["tenant", "status", "id"], name="op_tenant_status_id_idx"),
        models.Index(
            fields=["tenant", "status", "id"], name="op_tenant_other_status_idx", condition=~Q(status="succeeded")
        ),
    ),
    (
        "operation",
        models.Index(fields=["tenant", "created_at"], name="op_tenant_created_idx"),
        models.Index(fields=["tenant", "created_at"], name="op_exec_created_idx", condition=Q(mode="execute")),
    ),
    (
        "attempt",
        models.Index(
            fields=["adapter_revision", "finished_at"],
            name="attempt_revision_idx",
            condition=Q(adapter_revision__isnull=False),
        ),
        models.Index(
            fields=["adapter_revision", "started_at"],
            name="attempt_revision_start_idx",
            condition=Q(adapter_revision__isnull=False),
        ),
    ),
    (
        "operationevent",
        models.Index(fields=["operation", "at"], name="opevent_op_at_idx"),
        models.Index(fields=["operation"], name="opevent_op_idx"),
    ),
]

STORAGE = {
    "ledger_operation": "fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,"
    " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
    "ledger_attempt": "fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,"
    " autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
    "ledger_operationevent": "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02",
}
RESET = {
    table: ", ".join(part.split("=")[0].strip() for part in settings.split(",")) for table, settings in STORAGE.items()
}


def _create(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor == "postgresql":
        # A concurrent build interrupted half-way leaves an invalid index behind: a rerun
        # drops it first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
        schema_editor.execute(index.create_sql(model, schema_editor, concurrently=True))
    else:
        schema_editor.add_index(model, index)


def _drop(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
    else:
        schema_editor.remove_index(model, index)


def forwards(apps: Any, schema_editor: Any) -> None:
    for model_name, old, new in CHANGES:
        model = apps.get_model("ledger", model_name)
        _create(schema_editor, model, new)
        _drop(schema_editor, model, old)


def backwards(apps: Any, schema_editor: Any) -> None:
    for model_name, old, new in CHANGES:
        model = apps.get_model("ledger", model_name)
        _create(schema_editor, model, old)
        _drop(schema_editor, model, new)


def storage(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table, settings in STORAGE.items():
            schema_editor.execute(f"ALTER TABLE {table} SET ({settings})")


def storage_reset(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for table, names in RESET.items():
            schema_editor.execute(f"ALTER TABLE {table} RESET ({names})")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0020_async_providers_waiting"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                op
                for model_name, old, new in CHANGES
                for op in (
                    migrations.RemoveIndex(model_name=model_name, name=old.name),
                    migrations.AddIndex(model_name=model_name, index=new),
                )
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
        migrations.RunPython(storage, storage_reset),
    ]
