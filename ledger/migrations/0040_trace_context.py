from django.db import migrations, models


class Migration(migrations.Migration):
    """The claim's traceparent on its row (ADR 0015): a column with a database default, so
    adding it rewrites no row on PostgreSQL and older processes' inserts still work."""

    dependencies = [
        ("ledger", "0039_attempt_evidence"),
    ]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="trace_context",
            field=models.CharField(blank=True, db_default="", default="", max_length=55),
        ),
    ]
