"""Fair admission at the workers' take (ADR 0021).

* ``Tenant.take_share`` and ``Tenant.take_max_in_flight``: nullable columns (no rewrite, no
  default to fill) on the tenants' table, a reference table of a few hundred rows; their CHECKs
  validate those rows at once.
* ``open_exec_tenant_due_idx`` (tenant, status, next_attempt_at, id) over due execute-mode rows
  of the work queue's mirror, ``ledger_open_operation`` (ADR 0017): the fair take's skip scan
  over tenants. Partial, on a table as small as the work under way.
  CONCURRENTLY on PostgreSQL (no lock on writes at ten million rows), so not atomic; a valid
  index left by an interrupted run is kept, an invalid one rebuilt. Elsewhere the schema
  editor's own. Reversible: the backwards step drops it CONCURRENTLY.

``open_exec_due_idx`` stays: the take no longer reads it, but the due count and the sweeper's
ended lifetimes may (ADR 0017's table).
"""

from typing import Any

from django.db import migrations, models
from django.db.models import Q

INDEX = models.Index(
    fields=["tenant", "status", "next_attempt_at", "operation"],
    name="open_exec_tenant_due_idx",
    condition=Q(status__in=["queued", "retry_wait"], mode="execute"),
)


def _valid(schema_editor: Any, name: str) -> bool | None:
    """Whether the index exists and is valid (None: it does not exist)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else row[0]


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "OpenOperation")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, INDEX)
        return
    valid = _valid(schema_editor, INDEX.name)
    if valid:
        return
    if valid is False:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")
    schema_editor.add_index(model, INDEX, concurrently=True)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "OpenOperation")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0044_recalled_outputs_and_canary_gates"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="take_share",
            field=models.PositiveSmallIntegerField(
                blank=True,
                help_text="Rows per round of the workers' take (weight against other tenants); empty = the"
                " deployment's default",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="tenant",
            name="take_max_in_flight",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Operations being sent at once (claimed); empty = the deployment's default, never above it",
                null=True,
            ),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=Q(take_share__isnull=True) | Q(take_share__gte=1), name="tenant_take_share_valid"
            ),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=Q(take_max_in_flight__isnull=True) | Q(take_max_in_flight__gte=1),
                name="tenant_take_max_in_flight_valid",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="openoperation", index=INDEX)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
