"""The dashboard's activity chart, hour by hour and tenant by tenant: each finished hour is read
from the ledger once, not once per process (review.models.ActivityHour)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0025_partition_attempts_and_events"),
        ("review", "0010_erasure_uploads"),
    ]

    operations = [
        migrations.CreateModel(
            name="ActivityHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField()),
                ("provider", models.CharField(blank=True, max_length=100)),
                ("series", models.CharField(blank=True, max_length=16)),
                ("n", models.PositiveIntegerField(default=0)),
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
                "constraints": [
                    models.UniqueConstraint(fields=("tenant", "hour", "series", "provider"), name="activityhour_unique")
                ],
            },
        ),
    ]
