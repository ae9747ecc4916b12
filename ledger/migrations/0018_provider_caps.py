"""Provider rate and concurrency caps (ledger.providers.ratelimit).

The provider's declared caps, its token bucket (``ledger_providerrate``), and a partial index
on the claimed execute-mode rows by provider, which every take of a capped provider counts.
The index is built CONCURRENTLY on PostgreSQL (a partial index still reads the whole table
to build: no lock on writes meanwhile), so this migration is not atomic; elsewhere the schema
editor's plain CREATE INDEX.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

INFLIGHT = models.Index(
    fields=["provider"],
    name="op_exec_inflight_idx",
    condition=models.Q(("mode", "execute"), ("status", "claimed")),
)


def forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    if schema_editor.connection.vendor == "postgresql":
        # An interrupted concurrent build leaves an invalid index behind: a rerun drops it first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INFLIGHT.name}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {INFLIGHT.name} ON ledger_operation (provider_id)"
            " WHERE mode = 'execute' AND status = 'claimed'"
        )
    else:
        schema_editor.add_index(model, INFLIGHT)


def backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "Operation")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INFLIGHT.name}")
    else:
        schema_editor.remove_index(model, INFLIGHT)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0017_list_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="ProviderRate",
            fields=[
                (
                    "provider",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="rate_state",
                        serialize=False,
                        to="ledger.provider",
                    ),
                ),
                ("tokens", models.FloatField()),
                ("rate", models.FloatField()),
                ("refilled_at", models.DateTimeField()),
                ("quiet_since", models.DateTimeField()),
                ("lowered_at", models.DateTimeField(blank=True, null=True)),
                ("next_take_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "ledger_providerrate",
            },
        ),
        migrations.AddField(
            model_name="provider",
            name="max_in_flight",
            field=models.PositiveIntegerField(
                blank=True, help_text="most calls at once, over every worker; empty = no cap", null=True
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="rate_burst",
            field=models.PositiveIntegerField(
                db_default=1,
                default=1,
                help_text="calls that may go at once after a quiet spell (1 spaces the calls evenly); at most the rate",
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="rate_limit",
            field=models.PositiveIntegerField(
                blank=True, help_text="most calls per rate period, over every worker; empty = no rate", null=True
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="rate_period_seconds",
            field=models.PositiveIntegerField(
                db_default=1, default=1, help_text="seconds: the period of the rate (1 = per second, 60 = per minute)"
            ),
        ),
        migrations.AddConstraint(
            model_name="provider",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("max_in_flight__isnull", True), ("max_in_flight__gte", 1), _connector="OR"),
                    models.Q(("rate_limit__isnull", True), ("rate_limit__gte", 1), _connector="OR"),
                    ("rate_period_seconds__gte", 1),
                    ("rate_period_seconds__lte", 86400),
                    ("rate_burst__gte", 1),
                ),
                name="provider_caps_valid",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="operation", index=INFLIGHT)],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
