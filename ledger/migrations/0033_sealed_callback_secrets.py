"""A tenant's callback signing secrets stored sealed (docs/secrets.md).

``callback_secret`` and ``callback_secret_previous`` held the HMAC keys in clear: anyone who
could read the table (a dump, a replica, a console lookup on the column) could sign callbacks
as the service. They become ``ledger.models.SealedJSONField`` columns holding the envelope
``ledger.platform.crypto`` makes under the payload keys (``bytea`` on PostgreSQL, JSON text on SQLite),
sealed even where payload encryption is off; ``manage.py encryption_rotate`` re-seals them.

New columns are added, each clear value sealed into them, the old columns dropped and the new
ones renamed: a text column cannot be cast to the envelope in SQL (the sealing is Python). An
empty secret (never made) becomes NULL. Reversible: the way back opens each value into a text
column again (it needs the keys that sealed them).

**Locks (PostgreSQL)**: ``ADD COLUMN`` nullable and ``DROP COLUMN`` are catalog changes; the
copy updates one row per tenant (a small table).
"""

from typing import Any

from django.db import migrations

import ledger.models
from ledger.platform import crypto

PAIRS = (("callback_secret", "callback_secret_sealed"), ("callback_secret_previous", "callback_secret_previous_sealed"))


def seal(apps: Any, schema_editor: Any) -> None:
    Tenant = apps.get_model("ledger", "Tenant")
    for tenant in Tenant.objects.only("pk", *(clear for clear, _ in PAIRS)).order_by("pk"):
        updates = {
            sealed: crypto.seal_json(getattr(tenant, clear), always=True)
            for clear, sealed in PAIRS
            if getattr(tenant, clear)
        }
        if updates:
            Tenant.objects.filter(pk=tenant.pk).update(**updates)


def open_back(apps: Any, schema_editor: Any) -> None:
    Tenant = apps.get_model("ledger", "Tenant")
    for tenant in Tenant.objects.only("pk", *(sealed for _, sealed in PAIRS)).order_by("pk"):
        updates = {}
        for clear, sealed in PAIRS:
            value = getattr(tenant, sealed)
            if value is not None:
                opened = crypto.open_json(value)
                updates[clear] = opened if isinstance(opened, str) else ""
        if updates:
            Tenant.objects.filter(pk=tenant.pk).update(**updates)


class Migration(migrations.Migration):
    # Depends on 0031: ledger 0032 (the tenant's secret namespace) is made alongside; the two
    # touch different columns of the tenant.
    dependencies = [
        ("ledger", "0032_tenant_secret_namespace"),
    ]

    operations = [
        *(
            migrations.AddField(
                model_name="tenant",
                name=sealed,
                field=ledger.models.SealedJSONField(blank=True, editable=False, null=True),
            )
            for _, sealed in PAIRS
        ),
        migrations.RunPython(seal, open_back),
        *(migrations.RemoveField(model_name="tenant", name=clear) for clear, _ in PAIRS),
        *(migrations.RenameField(model_name="tenant", old_name=sealed, new_name=clear) for clear, sealed in PAIRS),
    ]
