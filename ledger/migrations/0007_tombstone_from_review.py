"""Tombstones move from ``review`` to the ledger (they answer claims).

The table already exists (review.0002 made it as ``review_tombstone``): this migration
takes the model into the ledger's state without touching the database, then renames the
table to ``ledger_tombstone`` — a rename in place, so an existing database keeps its rows,
constraint and index — and moves its content type (permissions follow the model).
review.0005 drops the model from review's state.
"""

import django.db.models.deletion
from django.db import migrations, models


def move_content_type(apps, schema_editor):
    # Granted permissions and admin log entries follow the model.
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label="ledger", model="tombstone").exists():
        content_type.objects.filter(app_label="review", model="tombstone").update(app_label="ledger")


def return_content_type(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label="review", model="tombstone").exists():
        content_type.objects.filter(app_label="ledger", model="tombstone").update(app_label="review")


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0006_counters_without_check_constraints"),
        # The table this migration adopts is created and last altered there.
        ("review", "0004_tombstone_tenant_index_covered_by_unique_key"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Tombstone",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("key", models.CharField(max_length=255)),
                        ("operation_id", models.BigIntegerField()),
                        ("mode", models.CharField(max_length=8)),
                        ("action", models.CharField(blank=True, max_length=100)),
                        ("provider_slug", models.CharField(blank=True, max_length=63)),
                        ("fingerprint", models.CharField(max_length=64)),
                        ("final_status", models.CharField(max_length=16)),
                        ("provider_ref", models.CharField(blank=True, max_length=255)),
                        ("response_status", models.PositiveIntegerField(blank=True, null=True)),
                        ("created_at", models.DateTimeField()),
                        ("done_at", models.DateTimeField()),
                        ("deleted_at", models.DateTimeField()),
                        ("keep_until", models.DateTimeField()),
                        (
                            "tenant",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="+",
                                to="ledger.tenant",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "review_tombstone",
                        "indexes": [models.Index(fields=["keep_until"], name="tombstone_keep_idx")],
                        "constraints": [models.UniqueConstraint(fields=("tenant", "key"), name="tombstone_unique_key")],
                    },
                ),
            ],
        ),
        migrations.AlterModelTable(name="tombstone", table="ledger_tombstone"),
        migrations.RunPython(move_content_type, return_content_type),
    ]
