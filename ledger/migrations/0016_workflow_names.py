"""Operations found by their workflow's name: the names a tenant's workflows were
seen with, one row per workflow and name (``WorkflowName``, written once when a name is first
seen, never by the claim's INSERT), searched by a trigram GIN index on PostgreSQL on the
expression Django's ``icontains`` compares, ``UPPER(name::text)`` (pg_trgm: migration 0010);
and a partial index on the operation's (tenant, workflow id), where a search by name ends.
The workflow id is written once, at the claim, so a completion pays nothing for it. SQLite
has no trigram indexes: its LIKE reads the (few) names."""

from typing import Any

from django.db import migrations, models

TRIGRAM_INDEX = "wfname_name_trgm"


def create_trigram_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {TRIGRAM_INDEX} ON ledger_workflowname"
            " USING gin ((UPPER(name::text)) gin_trgm_ops)"
        )


def drop_trigram_index(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRIGRAM_INDEX}")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0015_adapter_revisions"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowName",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("workflow_id", models.CharField(max_length=255)),
                ("name", models.CharField(max_length=255)),
                ("first_seen_at", models.DateTimeField(auto_now_add=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="+",
                        to="ledger.tenant",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "workflow_id", "name"), name="workflowname_unique")
                ],
            },
        ),
        migrations.AddIndex(
            model_name="operation",
            index=models.Index(
                condition=models.Q(("workflow_id", ""), _negated=True),
                fields=["tenant", "workflow_id"],
                name="op_workflow_idx",
            ),
        ),
        migrations.RunPython(create_trigram_index, drop_trigram_index),
    ]
