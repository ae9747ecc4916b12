"""DLQ changes and replays, alert deliveries carry their tenant (DESIGN §12, Citus): the
migrations that added the column copy it from the entry (the channel) on a database with rows."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from alerts.models import AlertDelivery
from dlq.models import FailedEventChange, Replay

BEFORE = [("dlq", "0011_n8n_connection_and_payload_source"), ("alerts", "0003_console_action_permissions")]


@pytest.mark.django_db(transaction=True)
def test_the_migrations_copy_each_rows_tenant_from_its_entry_and_channel() -> None:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate(BEFORE).apps
        now = timezone.now()
        # The ledger stays at its newest state: its historical Tenant needs the secret namespace
        # Tenant.save would give (ledger.0032; a historical model has no save of its own).
        old_tenant = old.get_model("ledger", "Tenant")
        has_namespace = any(f.name == "secret_namespace" for f in old_tenant._meta.fields)
        tenants = [
            old_tenant.objects.create(
                slug=f"dlq-mig-{n}", name="", **({"secret_namespace": f"DLQMIG{n}"} if has_namespace else {})
            )
            for n in range(2)
        ]
        expected = {}
        for tenant in tenants:
            entry = old.get_model("dlq", "FailedEvent").objects.create(
                tenant=tenant, event_id=f"e-{tenant.pk}", failed_at=now, last_seen_at=now
            )
            old.get_model("dlq", "FailedEventChange").objects.create(event=entry, to_status="pending", actor="t")
            old.get_model("dlq", "Replay").objects.create(
                event=entry, number=1, ledger_key="k", sent_key="k", target_slug="t", target_url="http://x",
                actor="t", started_at=now,
            )  # fmt: skip
            channel = old.get_model("alerts", "AlertChannel").objects.create(
                tenant=tenant, name="c", kind="webhook", url="http://127.0.0.1:9/a"
            )
            old.get_model("alerts", "AlertDelivery").objects.create(channel=channel, alert_ids=[1], body={})
            expected[entry.pk] = tenant.pk
        executor.loader.build_graph()
        executor.migrate(leaves)
        assert dict(FailedEventChange.objects.values_list("event_id", "tenant_id")) == expected
        assert dict(Replay.objects.values_list("event_id", "tenant_id")) == expected
        assert {d.tenant_id for d in AlertDelivery.objects.select_related("channel")} == set(expected.values())
        assert all(d.tenant_id == d.channel.tenant_id for d in AlertDelivery.objects.select_related("channel"))
    finally:
        executor.loader.build_graph()
        executor.migrate(leaves)
