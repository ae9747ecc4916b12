"""The console's provider pages and adapter revisions (DESIGN §5): a change of the adapter
fields saved as a canary, the rollout page showing revisions and the watch, an operator
promoting or rolling back by hand — each move in the configuration trail with its reason —
and a reviewer, who may look, moving nothing."""

from __future__ import annotations

from ledger.execution.submission import operation_submit
from ledger.models import AdapterRevision, ConfigChange, Operation, Provider
from tests.console.support import client_for, enforced_provider, page, staff, submit_form


def test_an_adapter_change_saved_in_the_console_as_a_canary_then_rolled_back_and_promoted_by_hand(tenant):
    provider = enforced_provider(tenant, "crm")
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))
    response = submit_form(
        ada,
        f"/admin/ledger/provider/{provider.pk}/change/",
        base_url="http://127.0.0.1:9/v2",
        rollout_percent="30",
        change_reason="CRM API v2",
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    provider.refresh_from_db()
    assert provider.base_url == "http://127.0.0.1:9" and provider.canary_percent == 30
    canary_rev = AdapterRevision.objects.get(provider=provider, number=2)
    assert canary_rev.config["base_url"] == "http://127.0.0.1:9/v2" and canary_rev.created_by == "user:ada"
    assert canary_rev.reason == "CRM API v2"
    start = ConfigChange.objects.filter(object_type="ledger.provider", reason="CRM API v2").get()
    assert start.before == {"canary_revision": None, "canary_percent": 0}
    assert start.after == {"canary_revision": 2, "canary_percent": 30}

    # While the canary runs, the form refuses another adapter change (and says why).
    status, body = page(ada, f"/admin/ledger/provider/{provider.pk}/change/")
    assert "r1 · canary r2 at 30 %" in body
    refused = submit_form(ada, f"/admin/ledger/provider/{provider.pk}/change/", timeout_seconds="4")
    assert refused.status_code == 200 and "runs as a canary" in refused.content.decode()

    keys = [f"k-{i}" for i in range(30)]
    for key in keys:
        operation_submit(tenant=tenant, key=key, provider="crm", request={"method": "POST", "path": "/x"})
    on_canary = Operation.objects.filter(adapter_revision=canary_rev).count()
    assert 0 < on_canary < 30

    # An operator (not allowed to edit providers) rolls the canary back in an incident.
    olga = client_for(staff("olga", role="operator", tenants=[tenant]))
    rollout = f"/admin/ledger/provider/{provider.pk}/rollout/"
    status, body = page(olga, rollout)
    assert status == 200 and 'data-testid="watch"' in body and "collecting" in body
    assert "CRM API v2" in body and 'data-testid="rollback"' in body
    missing_reason = olga.post(rollout, {"verb": "rollback", "reason": ""})
    assert missing_reason.status_code == 200 and Provider.objects.get(pk=provider.pk).canary_revision_id is not None
    done = olga.post(rollout, {"verb": "rollback", "reason": "errors in the CRM's logs"}, follow=True)
    assert f"{on_canary} operation(s) re-queued" in done.content.decode()
    assert Operation.objects.filter(adapter_revision=canary_rev).count() == 0
    back = ConfigChange.objects.filter(reason="errors in the CRM's logs").get()
    assert back.actor == "user:olga" and back.after == {"canary_revision": None, "canary_percent": 0}

    # Later, by hand, straight to stable (roll forward).
    olga.post(rollout, {"verb": "promote", "number": "2", "reason": "fixed on their side"})
    provider.refresh_from_db()
    assert provider.revision.number == 2 and provider.base_url == "http://127.0.0.1:9/v2"
    status, body = page(olga, rollout)
    assert "fixed on their side" in body and "errors in the CRM&#x27;s logs" in body


def test_a_reviewer_sees_the_rollout_but_moves_nothing(tenant):
    provider = enforced_provider(tenant, "crm")
    rita = client_for(staff("rita", role="reviewer", tenants=[tenant]))
    rollout = f"/admin/ledger/provider/{provider.pk}/rollout/"
    status, body = page(rita, rollout)
    assert status == 200 and 'data-testid="revisions"' in body and 'data-testid="rollback"' not in body
    assert rita.post(rollout, {"verb": "rollback", "reason": "x"}).status_code == 403
    assert ConfigChange.objects.filter(reason="x").count() == 0


def test_another_tenants_staff_cannot_reach_the_rollout_page(tenant, other_tenant):
    provider = enforced_provider(tenant, "crm")
    stranger = client_for(staff("sam", role="operator", tenants=[other_tenant]))
    rollout = f"/admin/ledger/provider/{provider.pk}/rollout/"
    assert stranger.get(rollout).status_code == 404
    assert stranger.post(rollout, {"verb": "rollback", "reason": "x"}).status_code == 404
