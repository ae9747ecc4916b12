"""Alert channel webhook URLs stored sealed (docs/secrets.md).

A Slack or Discord webhook URL is a bearer secret: whoever holds it may post to the channel.
``url`` held it in clear; it becomes a ``ledger.models.SealedJSONField`` holding the envelope
``ledger.platform.crypto`` makes under the payload keys (``bytea`` on PostgreSQL, JSON text on SQLite),
sealed even where payload encryption is off; ``manage.py encryption_rotate`` re-seals it.

A new column is added, each URL sealed into it, the old column dropped and the new one renamed
(the sealing is Python, not a cast), then made NOT NULL. Reversible: the way back opens each
URL into a text column again (it needs the keys that sealed them).

**Locks (PostgreSQL)**: ``ADD COLUMN`` nullable and ``DROP COLUMN`` are catalog changes; the
copy updates one row per channel (a small table); ``SET NOT NULL`` reads it once under ACCESS
EXCLUSIVE (milliseconds).
"""

from typing import Any

from django.db import migrations, models

import ledger.models
from ledger.platform import crypto


def seal(apps: Any, schema_editor: Any) -> None:
    AlertChannel = apps.get_model("alerts", "AlertChannel")
    for channel in AlertChannel.objects.only("pk", "url").order_by("pk"):
        AlertChannel.objects.filter(pk=channel.pk).update(url_sealed=crypto.seal_json(channel.url, always=True))


def open_back(apps: Any, schema_editor: Any) -> None:
    AlertChannel = apps.get_model("alerts", "AlertChannel")
    for channel in AlertChannel.objects.only("pk", "url_sealed").order_by("pk"):
        opened = crypto.open_json(channel.url_sealed)
        AlertChannel.objects.filter(pk=channel.pk).update(url=opened if isinstance(opened, str) else "")


class Migration(migrations.Migration):
    dependencies = [
        ("alerts", "0004_tenant_on_deliveries"),
    ]

    operations = [
        migrations.AddField(
            model_name="alertchannel",
            name="url_sealed",
            field=ledger.models.SealedJSONField(editable=False, null=True),
        ),
        # Nullable before the copy: on the way back the clear column is added again empty and
        # filled by open_back before it is NOT NULL once more.
        migrations.AlterField(model_name="alertchannel", name="url", field=models.URLField(max_length=1000, null=True)),
        migrations.RunPython(seal, open_back),
        migrations.RemoveField(model_name="alertchannel", name="url"),
        migrations.RenameField(model_name="alertchannel", old_name="url_sealed", new_name="url"),
        migrations.AlterField(
            model_name="alertchannel",
            name="url",
            field=ledger.models.SealedJSONField(editable=False),
        ),
    ]
