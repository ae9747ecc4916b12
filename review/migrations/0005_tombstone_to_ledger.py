"""Tombstones now belong to the ledger (ledger.0007 adopted and renamed the table):
review forgets the model, and the database is not touched."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("review", "0004_tombstone_tenant_index_covered_by_unique_key"),
        ("ledger", "0007_tombstone_from_review"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="Tombstone")]),
    ]
