"""Lists that stay index scans at ten million rows.

The operations API and console list a tenant's rows newest first (``ORDER BY id DESC``),
optionally by state. Without an index whose order is the list's, PostgreSQL walks the primary
key backwards and filters: quick when the tenant's rows are dense among the newest, seconds to
minutes when they are old or the filter matches nothing — and a prepared statement's generic
plan, which cannot see the tenant or the state, takes that walk for every tenant. With
``(tenant, id)`` and ``(tenant, status, id)`` the first 51 rows are read straight off the
index whatever the tenant, the state or the plan. ``(tenant, status, id)`` replaces
``(tenant, status, updated_at)``: everything that read the old one (admission's open-row
counts, the dashboard, the review list) filters on tenant and status and reads no further.

Built CONCURRENTLY on PostgreSQL (no lock on writes while a large table is indexed), so this
migration is not atomic; elsewhere the schema editor's plain CREATE INDEX.
"""

from typing import Any

from django.db import migrations, models

NEW = [
    models.Index(fields=["tenant", "id"], name="op_tenant_id_idx"),
    models.Index(fields=["tenant", "status", "id"], name="op_tenant_status_id_idx"),
]
OLD = models.Index(fields=["tenant", "status", "updated_at"], name="op_tenant_status_idx")


def _create(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor == "postgresql":
        # A concurrent build interrupted half-way leaves an invalid index behind: a rerun
        # drops it first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
        columns = ", ".join(f'"{model._meta.get_field(f).column}"' for f in index.fields)
        schema_editor.execute(f"CREATE INDEX CONCURRENTLY {index.name} ON {model._meta.db_table} ({columns})")
    else:
        schema_editor.add_index(model, index)


def _drop(schema_editor: Any, model: Any, index: models.Index) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {index.name}")
    else:
        schema_editor.remove_index(model, index)


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    for index in NEW:
        _create(schema_editor, model, index)
    _drop(schema_editor, model, OLD)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    _create(schema_editor, model, OLD)
    for index in NEW:
        _drop(schema_editor, model, index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0016_workflow_names"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="operation", name="op_tenant_status_idx"),
                *(migrations.AddIndex(model_name="operation", index=index) for index in NEW),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
