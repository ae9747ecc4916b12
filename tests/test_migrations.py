"""Every model change has its migration (and nothing non-deterministic makes phantom ones)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_is_missing_a_migration():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits non-zero when a migration would be written
        raise AssertionError(f"missing migration:\n{out.getvalue()}") from exc
    assert "No changes detected" in out.getvalue()


# The moves of issue 10: tombstones into the ledger, alerts into their own app. Each keeps an
# existing database's rows (the tables are renamed in place) and its content types.
BEFORE_THE_MOVES = [
    ("ledger", "0006_counters_without_check_constraints"),
    ("review", "0004_tombstone_tenant_index_covered_by_unique_key"),
    ("dlq", "0005_alertdelivery_plural"),
    ("alerts", None),
]


@pytest.mark.django_db(transaction=True)
def test_moving_tombstones_and_alerts_keeps_their_rows_and_content_types():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate(BEFORE_THE_MOVES).apps
        now = timezone.now()
        tenant = old.get_model("ledger", "Tenant").objects.create(slug="moved", name="moved")
        old.get_model("review", "Tombstone").objects.create(
            tenant=tenant, key="k-1", operation_id=41, mode="guard", fingerprint="f" * 64, final_status="succeeded",
            created_at=now, done_at=now, deleted_at=now, keep_until=now,
        )  # fmt: skip
        channel = old.get_model("dlq", "AlertChannel").objects.create(
            tenant=tenant, name="ops", kind="webhook", url="http://127.0.0.1:9/a"
        )
        alert = old.get_model("dlq", "Alert").objects.create(
            tenant=tenant, kind="dlq_new", ref="7", summary="s", dedup_key="d", created_at=now, last_raised_at=now
        )
        old.get_model("dlq", "AlertDelivery").objects.create(channel=channel, alert_ids=[alert.pk], body={"t": 1})
        content_type = old.get_model("contenttypes", "ContentType")
        # A database from before the moves has only the old apps' content types; the test
        # database was made at the newest state, so it has the new ones too: drop those (the
        # flush after this test makes them again).
        content_type.objects.filter(app_label="alerts").delete()
        content_type.objects.filter(app_label="ledger", model="tombstone").delete()
        for app, model in [("review", "tombstone"), ("dlq", "alert"), ("dlq", "alertchannel")]:
            content_type.objects.get_or_create(app_label=app, model=model)
        moved_ids = set(
            content_type.objects.filter(model__in=["tombstone", "alert", "alertchannel"]).values_list("pk", flat=True)
        )

        MigrationExecutor(connection).migrate(leaves)

        from django.contrib.contenttypes.models import ContentType

        from alerts.models import Alert, AlertChannel, AlertDelivery
        from ledger.models import Tombstone

        assert Tombstone._meta.db_table == "ledger_tombstone"
        assert Tombstone.objects.get(tenant_id=tenant.pk).key == "k-1"
        assert AlertChannel.objects.get(tenant_id=tenant.pk).name == "ops"
        assert Alert.objects.get(tenant_id=tenant.pk).pk == alert.pk
        assert AlertDelivery.objects.get(channel__tenant_id=tenant.pk).alert_ids == [alert.pk]
        tables = set(connection.introspection.table_names())
        assert {"ledger_tombstone", "alerts_alert", "alerts_alertchannel", "alerts_alertdelivery"} <= tables
        assert not {"review_tombstone", "dlq_alert", "dlq_alertchannel", "dlq_alertdelivery"} & tables
        # The same content type rows, now under the owning app: permissions follow the models.
        ContentType.objects.clear_cache()
        assert {ct.app_label for ct in ContentType.objects.filter(pk__in=moved_ids)} == {"ledger", "alerts"}
    finally:
        MigrationExecutor(connection).migrate(leaves)
        from django.contrib.contenttypes.models import ContentType

        ContentType.objects.clear_cache()
