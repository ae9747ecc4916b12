"""DLQ changes and replays carry their entry's tenant (DESIGN §12, Citus).

Citus routes a statement to one node by ``tenant_id``: the entry's change rows and replay rows
get the column, copied from their entry, and every statement on them names it. The replays'
unique number per entry gains the tenant (Citus keeps a distributed table's unique constraint
only when it holds the distribution column; an entry's replays are one tenant's anyway).

**Locks (PostgreSQL).** Both tables grow with the dead-letter queue (a row per status change or
replay: thousands, not the ledger's millions). ``ADD COLUMN`` nullable is catalog only; the foreign
key to the tenant is added and validated (SHARE ROW EXCLUSIVE on the table while it reads it: writes
to the table wait, reads go on); the copy runs in batches of ``BATCH`` ids, each its own
transaction; ``SET NOT NULL`` then reads the table once under ACCESS EXCLUSIVE (a DLQ-sized table:
milliseconds to a second); the unique index is replaced in one transaction (built under SHARE:
writes wait). A DLQ as large as the ledger would take the ledger's path instead (migration ledger
0029: a validated CHECK spares the scan, indexes built CONCURRENTLY).
"""

from typing import Any

from django.db import migrations, models

from ledger.platform.backfill import backfill_in_batches

BATCH = 10_000
COPIES = {
    "dlq_failedeventchange": (
        "UPDATE dlq_failedeventchange SET tenant_id = e.tenant_id FROM dlq_failedevent e"
        " WHERE e.id = dlq_failedeventchange.event_id AND dlq_failedeventchange.id >= %s"
        " AND dlq_failedeventchange.id < %s AND dlq_failedeventchange.tenant_id IS NULL"
    ),
    "dlq_replay": (
        "UPDATE dlq_replay SET tenant_id = e.tenant_id FROM dlq_failedevent e"
        " WHERE e.id = dlq_replay.event_id AND dlq_replay.id >= %s AND dlq_replay.id < %s"
        " AND dlq_replay.tenant_id IS NULL"
    ),
}


def backfill(apps: Any, schema_editor: Any) -> None:
    backfill_in_batches(schema_editor, COPIES, BATCH)


def _tenant(null: bool) -> models.ForeignKey:
    return models.ForeignKey(
        null=null, on_delete=models.deletion.CASCADE, related_name="+", db_index=False, to="ledger.tenant"
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("dlq", "0011_n8n_connection_and_payload_source"),
    ]

    operations = [
        migrations.AddField("failedeventchange", "tenant", _tenant(null=True)),
        migrations.AddField("replay", "tenant", _tenant(null=True)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField("failedeventchange", "tenant", _tenant(null=False)),
        migrations.AlterField("replay", "tenant", _tenant(null=False)),
        migrations.RemoveConstraint("replay", "replay_unique_number"),
        migrations.AddConstraint(
            "replay", models.UniqueConstraint(fields=["tenant", "event", "number"], name="replay_unique_number")
        ),
    ]
