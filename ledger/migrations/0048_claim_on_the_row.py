"""The claim's move kept on the operation row (ADR 0024): two columns on ``ledger_operation``.

**Locks, on PostgreSQL.** Nothing is rewritten or scanned: ``ADD COLUMN claim_actor varchar(150)
NULL`` and ``ADD COLUMN claim_sent boolean NULL``, neither with a default, are catalog changes
under a brief ACCESS EXCLUSIVE lock. Existing rows read NULL: their claim is an event row, as
before. Both nullable without a default on purpose: SQLite then adds them with ALTER TABLE ADD
COLUMN instead of Django's copy of the table, which would drop the work queue's triggers
(ledger.store.open_rows) with the old table.
Reversible: the columns are dropped.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0047_lean_operation_row")]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="claim_actor",
            field=models.CharField(blank=True, max_length=150, null=True),
        ),
        migrations.AddField(
            model_name="operation",
            name="claim_sent",
            field=models.BooleanField(blank=True, null=True),
        ),
    ]
