"""The Restore holds page (ADR 0012) by role and tenant: an operator of the hold's tenant
resolves it (audited); an auditor reads it and may not; staff of another tenant never see it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ledger.models import ConfigChange, FenceHold
from tests.console.support import client_for, enforced_provider, staff

pytestmark = pytest.mark.django_db


@pytest.fixture
def hold(tenant) -> FenceHold:
    provider = enforced_provider(tenant)
    return FenceHold.objects.create(
        tenant=tenant,
        key="held-order-7",
        provider_id=provider.pk,
        journaled_state="claimed",
        epoch=4,
        found_at=timezone.now(),
    )


def test_an_operator_of_the_tenant_releases_a_hold_with_a_reason(tenant, hold) -> None:
    client = client_for(staff("op", role="operator", tenants=[tenant]))
    assert b"held-order-7" in client.get("/admin/ledger/fencehold/").content
    url = f"/admin/ledger/fencehold/{hold.pk}/resolve/"
    assert b'data-testid="release"' in client.get(url).content
    assert client.post(url, {"verb": "released", "reason": "the mailer's log has no such message"}).status_code == 302
    hold.refresh_from_db()
    assert (hold.resolution, hold.resolved_by) == ("released", "user:op")
    trail = ConfigChange.objects.get(object_type="fence_hold", object_id=str(hold.pk))
    assert (trail.tenant_id, trail.actor) == (tenant.pk, "user:op")
    # Resolved: the page shows the decision and offers nothing more.
    page = client.get(url).content
    assert b"released by a person" in page and b'data-testid="release"' not in page


def test_an_auditor_reads_the_hold_but_may_not_resolve_it(tenant, hold) -> None:
    client = client_for(staff("aud", role="auditor", tenants=[tenant]))
    url = f"/admin/ledger/fencehold/{hold.pk}/resolve/"
    page = client.get(url)
    assert page.status_code == 200 and b'data-testid="release"' not in page.content
    assert client.post(url, {"verb": "released", "reason": "x"}).status_code == 403
    assert FenceHold.objects.get().resolution == "open"


def test_staff_of_another_tenant_never_see_the_hold(tenant, other_tenant, hold) -> None:
    client = client_for(staff("other-op", role="operator", tenants=[other_tenant]))
    assert b"held-order-7" not in client.get("/admin/ledger/fencehold/").content
    assert client.get(f"/admin/ledger/fencehold/{hold.pk}/resolve/").status_code == 404
    assert (
        client.post(f"/admin/ledger/fencehold/{hold.pk}/resolve/", {"verb": "released", "reason": "x"}).status_code
        == 404
    )
