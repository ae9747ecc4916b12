"""A 429 lowers a provider's concurrency too (ADR 0008): the bucket row keeps the effective
in-flight limit it lowered, since when and why, and the provider may set its own quiet period.

Every new column is nullable or has a database default, so adding them rewrites nothing; the
bucket's limit has no CHECK (its statements keep it at least 1), so no table is scanned. The
provider's caps constraint is replaced to bound the quiet period (a table of one row per
provider).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0035_event_error_trigram_index"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="provider",
            name="provider_caps_valid",
        ),
        migrations.AddField(
            model_name="provider",
            name="concurrency_recovery_seconds",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="seconds without a 429 per +1 of a lowered in-flight limit; empty = the deployment's default",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="providerrate",
            name="concurrency",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="providerrate",
            name="concurrency_quiet_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="providerrate",
            name="concurrency_reason",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
        migrations.AddField(
            model_name="providerrate",
            name="concurrency_since",
            field=models.DateTimeField(blank=True, null=True),
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
                    models.Q(
                        ("concurrency_recovery_seconds__isnull", True),
                        models.Q(
                            ("concurrency_recovery_seconds__gte", 1), ("concurrency_recovery_seconds__lte", 86400)
                        ),
                        _connector="OR",
                    ),
                ),
                name="provider_caps_valid",
            ),
        ),
    ]
