"""Alerts get their own app: the Alert, AlertChannel and AlertDelivery tables move
from ``dlq`` without copying a row.

1. The models enter the alerts app's state over their existing tables (created by
   dlq.0002; no database operation).
2. The tables are renamed in place to ``alerts_*``, so the schema says who owns them (a
   rename is a catalog change on PostgreSQL and SQLite; rows, indexes, constraints and
   foreign keys stay).
3. The content types move too, so granted permissions and admin log entries follow the
   models instead of pointing at models that no longer exist.
4. The flush schedule the DLQ installed is replaced by the alerts' own.

dlq.0006 then drops the models from the DLQ's state.
"""

import django.db.models.deletion
from django.db import migrations, models

MODELS = ("alert", "alertchannel", "alertdelivery")
OLD_FLUSH = "dlq: alert flush and retries"
NEW_FLUSH = ("alerts: flush and retries", "alerts.tasks.alerts_flush_task")


def move_content_types(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not content_type.objects.filter(app_label="alerts", model=model).exists():
            content_type.objects.filter(app_label="dlq", model=model).update(app_label="alerts")


def return_content_types(apps, schema_editor):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not content_type.objects.filter(app_label="dlq", model=model).exists():
            content_type.objects.filter(app_label="alerts", model=model).update(app_label="dlq")


def move_flush_schedule(apps, schema_editor):
    schedule = apps.get_model("django_q", "Schedule")
    schedule.objects.filter(name=OLD_FLUSH).delete()
    name, func = NEW_FLUSH
    schedule.objects.update_or_create(
        name=name, defaults={"func": func, "schedule_type": "I", "minutes": 1, "repeats": -1}
    )


def return_flush_schedule(apps, schema_editor):
    schedule = apps.get_model("django_q", "Schedule")
    schedule.objects.filter(name=NEW_FLUSH[0]).delete()
    schedule.objects.update_or_create(
        name=OLD_FLUSH,
        defaults={"func": "dlq.tasks.alerts_flush_task", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        # The tables this migration adopts were created and last altered there.
        ("dlq", "0005_alertdelivery_plural"),
        ("ledger", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="AlertChannel",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=63)),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("slack", "Slack incoming webhook"),
                                    ("discord", "Discord webhook"),
                                    ("webhook", "generic JSON webhook"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("url", models.URLField(max_length=1000)),
                        ("kinds", models.JSONField(blank=True, default=list)),
                        ("active", models.BooleanField(default=True)),
                        ("timeout_seconds", models.FloatField(default=5.0)),
                        ("digest_threshold", models.PositiveIntegerField(default=3)),
                        ("max_messages_per_window", models.PositiveIntegerField(default=5)),
                        ("window_seconds", models.PositiveIntegerField(default=60)),
                        ("cursor_alert_id", models.BigIntegerField(default=0)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="alert_channels",
                                to="ledger.tenant",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dlq_alertchannel",
                        "constraints": [
                            models.UniqueConstraint(fields=("tenant", "name"), name="alertchannel_unique_name")
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="AlertDelivery",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("alert_ids", models.JSONField(default=list)),
                        ("alert_count", models.PositiveIntegerField(default=1)),
                        ("digest", models.BooleanField(default=False)),
                        ("body", models.JSONField()),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("pending", "pending"),
                                    ("sent", "sent"),
                                    ("retrying", "retrying"),
                                    ("dead", "dead"),
                                ],
                                default="pending",
                                max_length=16,
                            ),
                        ),
                        ("attempts", models.PositiveIntegerField(default=0)),
                        ("next_attempt_at", models.DateTimeField(blank=True, null=True)),
                        ("last_error", models.CharField(blank=True, max_length=300)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("sent_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "channel",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="deliveries",
                                to="alerts.alertchannel",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dlq_alertdelivery",
                        "verbose_name_plural": "alert deliveries",
                        "indexes": [
                            models.Index(fields=["channel", "created_at"], name="alertdelivery_channel_idx"),
                            models.Index(
                                condition=models.Q(("status__in", ["pending", "retrying"])),
                                fields=["next_attempt_at"],
                                name="alertdelivery_due_idx",
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Alert",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("kind", models.CharField(max_length=50)),
                        ("ref", models.CharField(max_length=255)),
                        ("summary", models.CharField(max_length=300)),
                        ("dedup_key", models.CharField(max_length=400)),
                        ("repeat_count", models.PositiveIntegerField(default=0)),
                        ("created_at", models.DateTimeField()),
                        ("last_raised_at", models.DateTimeField()),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="alerts", to="ledger.tenant"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "dlq_alert",
                        "indexes": [models.Index(fields=["tenant", "id"], name="alert_tenant_id_idx")],
                        "constraints": [models.UniqueConstraint(fields=("tenant", "dedup_key"), name="alert_dedup")],
                    },
                ),
            ],
        ),
        # Back to the default table names: renames dlq_* to alerts_*.
        migrations.AlterModelTable(name="alertchannel", table=None),
        migrations.AlterModelTable(name="alertdelivery", table=None),
        migrations.AlterModelTable(name="alert", table=None),
        migrations.RunPython(move_content_types, return_content_types),
        migrations.RunPython(move_flush_schedule, return_flush_schedule),
    ]
