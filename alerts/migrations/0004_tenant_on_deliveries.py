"""Alert deliveries carry their channel's tenant (DESIGN §12, Citus).

Citus routes a statement to one node by ``tenant_id``: a delivery gets its channel's, copied
here and written by every insert. **Locks (PostgreSQL)**: a row per message sent to a channel
(alerts are digested: a small table). ``ADD COLUMN`` nullable is catalog only; the foreign key
to the tenant is validated under SHARE ROW EXCLUSIVE (writes to the table wait, reads go on);
the copy runs in batches of ids, each its own transaction; ``SET NOT NULL`` reads the table
once under ACCESS EXCLUSIVE (milliseconds for an alert-sized table).
"""

from typing import Any

from django.db import migrations, models

from ledger.platform.backfill import backfill_in_batches

BATCH = 10_000
COPIES = {
    "alerts_alertdelivery": (
        "UPDATE alerts_alertdelivery SET tenant_id = c.tenant_id FROM alerts_alertchannel c"
        " WHERE c.id = alerts_alertdelivery.channel_id AND alerts_alertdelivery.id >= %s"
        " AND alerts_alertdelivery.id < %s AND alerts_alertdelivery.tenant_id IS NULL"
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
        ("alerts", "0003_console_action_permissions"),
    ]

    operations = [
        migrations.AddField("alertdelivery", "tenant", _tenant(null=True)),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField("alertdelivery", "tenant", _tenant(null=False)),
    ]
