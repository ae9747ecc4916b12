"""/metrics speaks Prometheus text and reflects the ledger and the DLQ."""

from __future__ import annotations

import pytest
from django.test import Client

from ledger import services
from ledger.models import IdempotencyClass

pytestmark = pytest.mark.django_db


def _value(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


def test_metrics_show_leases_review_backlog_and_dlq_by_status(tenant):
    provider = services.provider_upsert(
        tenant=tenant, slug="mail", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ADVISORY
    )
    held = services.operation_claim(tenant=tenant, key="m:1", provider=provider, mark_sent=True).operation
    failed = services.operation_claim(tenant=tenant, key="m:2", provider=provider).operation
    services.operation_fail(operation_id=failed.pk, lease_token=failed.lease_token, error_class="invalid_input")
    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert _value(text, "onceguard_active_leases") == 1
    assert _value(text, "onceguard_review_backlog") == 0
    assert 'onceguard_dlq_entries{status="pending"} 1' in text
    assert "# TYPE onceguard_attempts_total counter" in text
    assert "m:1" not in text and held.key not in text  # no keys or payloads


def test_metrics_token_is_required_when_configured(monkeypatch):
    monkeypatch.setenv("METRICS_TOKEN", "s3cret")
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
