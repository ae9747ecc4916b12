"""Adapter rollout moves by hand (DESIGN §5, adapter revisions): the API and the management
command start a canary, promote it (roll forward) and roll back, each recorded in the
configuration trail with its actor and reason; scopes and tenants are respected."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from ledger.execution.submission import operation_submit
from ledger.models import AdapterRevision, ConfigChange, IdempotencyClass, Operation
from ledger.protocol import services
from tests.ledger.support import assert_problem

BASE = "http://127.0.0.1:9"


@pytest.fixture
def charges(tenant):
    return services.provider_upsert(
        tenant=tenant, slug="charges", base_url=BASE, idempotency_class=IdempotencyClass.KEY_ENFORCED
    )


def api_for(tenant, scopes):
    _, secret = services.apikey_create(tenant=tenant, scopes=scopes)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def v2(tenant, **extra):
    return services.provider_upsert(
        tenant=tenant, slug="charges", base_url=BASE + "/v2", reason="API v2", actor="user:alice", **extra
    )


def test_the_api_lists_revisions_and_an_admin_key_starts_promotes_and_rolls_back_audited(tenant, charges):
    v2(tenant)  # revision 2, stable at once
    admin = api_for(tenant, ["admin"])
    listing = admin.get("/api/v1/providers/charges/revisions")
    assert listing.status_code == 200
    body = listing.json()
    assert body["stable_revision"] == 2 and body["canary_revision"] is None and body["watch"] is None
    assert [(r["number"], r["role"], r["based_on"]) for r in body["revisions"]] == [
        (2, "stable", 1),
        (1, "retired", None),
    ]
    assert body["revisions"][0]["config"]["base_url"] == BASE + "/v2" and body["revisions"][0]["reason"] == "API v2"

    # Revision 1 as a canary for 25 % of new operations, then rolled back, then again, promoted.
    started = admin.post("/api/v1/providers/charges/revisions/1/canary", {"percent": 25, "reason": "try"}, "json")
    assert started.status_code == 200, started.content
    assert started.json()["canary_revision"] == 1 and started.json()["watch"]["verdict"] == "collecting"
    op_ids = [
        operation_submit(
            tenant=tenant, key=f"k-{i}", provider="charges", request={"method": "POST", "path": "/charges"}
        ).operation.pk
        for i in range(40)
    ]
    on_canary = Operation.objects.filter(pk__in=op_ids, adapter_revision__number=1).count()
    assert 0 < on_canary < 40
    back = admin.post("/api/v1/providers/charges/revisions/rollback", {"reason": "not yet"}, "json")
    assert back.status_code == 200 and back.json()["requeued"] == on_canary
    assert Operation.objects.filter(pk__in=op_ids, adapter_revision__number=2).count() == 40
    admin.post("/api/v1/providers/charges/revisions/1/canary", {"percent": 100, "reason": "again"}, "json")
    promoted = admin.post("/api/v1/providers/charges/revisions/promote", {"reason": "v1 it is"}, "json")
    assert promoted.status_code == 200 and promoted.json()["stable_revision"] == 1
    charges.refresh_from_db()
    assert charges.base_url == BASE

    moves = list(
        ConfigChange.objects.filter(object_type="ledger.provider", actor__startswith="apikey:")
        .order_by("id")
        .values_list("reason", "before", "after")
    )
    assert [m[0] for m in moves] == ["try", "not yet", "again", "v1 it is"]
    assert moves[-1][1] == {"revision": 2, "canary_revision": 1, "canary_percent": 100}
    assert moves[-1][2] == {"revision": 1, "canary_revision": None, "canary_percent": 0}


def test_rollout_moves_need_the_admin_scope_a_reason_and_the_callers_own_tenant(tenant, other_tenant, charges):
    v2(tenant)
    writer = api_for(tenant, ["read", "write"])
    assert_problem(
        writer.post("/api/v1/providers/charges/revisions/rollback", {"reason": "x"}, "json"), 403, "forbidden"
    )
    assert writer.get("/api/v1/providers/charges/revisions").status_code == 200
    admin = api_for(tenant, ["admin"])
    assert_problem(admin.post("/api/v1/providers/charges/revisions/rollback", {}, "json"), 400, "validation_error")
    assert_problem(
        admin.post("/api/v1/providers/charges/revisions/promote", {"reason": "no canary"}, "json"),
        409,
        "adapter_rollout_conflict",
    )
    assert_problem(
        admin.post("/api/v1/providers/charges/revisions/9/canary", {"percent": 5, "reason": "x"}, "json"),
        404,
        "not_found",
    )
    assert_problem(
        admin.post("/api/v1/providers/charges/revisions/1/canary", {"percent": 0, "reason": "x"}, "json"),
        400,
        "validation_error",
    )
    stranger = api_for(other_tenant, ["admin"])
    assert_problem(stranger.get("/api/v1/providers/charges/revisions"), 404, "not_found")
    assert_problem(
        stranger.post("/api/v1/providers/charges/revisions/rollback", {"reason": "x"}, "json"), 404, "not_found"
    )
    assert ConfigChange.objects.filter(reason="x").count() == 0


def test_the_command_runs_a_canary_promotes_and_rolls_back_as_the_os_account(tenant, charges):
    out = io.StringIO()
    call_command(
        "provider_upsert",
        "--tenant=acme",
        "--slug=charges",
        f"--base-url={BASE}/v3",
        "--class=key_enforced",
        "--canary-percent=10",
        "--reason=v3 rollout",
        stdout=out,
    )
    charges.refresh_from_db()
    assert charges.base_url == BASE and charges.canary_percent == 10
    assert AdapterRevision.objects.get(provider=charges, number=2).config["base_url"] == BASE + "/v3"
    call_command("provider_revision", "list", "--tenant=acme", "--slug=charges", stdout=out)
    assert "canary revision 2 at 10 %" in out.getvalue() and "v3 rollout" in out.getvalue()
    with pytest.raises(CommandError, match="reason"):
        call_command("provider_revision", "promote", "--tenant=acme", "--slug=charges", stdout=out)
    call_command("provider_revision", "promote", "--tenant=acme", "--slug=charges", "--reason=ok", stdout=out)
    charges.refresh_from_db()
    assert charges.base_url == BASE + "/v3" and charges.canary_revision_id is None
    with pytest.raises(CommandError, match="name the revision"):
        call_command("provider_revision", "rollback", "--tenant=acme", "--slug=charges", "--reason=bad", stdout=out)
    call_command(
        "provider_revision", "rollback", "--tenant=acme", "--slug=charges", "--number=1", "--reason=bad", stdout=out
    )
    charges.refresh_from_db()
    assert charges.base_url == BASE and charges.revision.number == 1
    assert "rolled back revision 2; stable is revision 1" in out.getvalue()
    trail = ConfigChange.objects.filter(object_type="ledger.provider", reason__in=["v3 rollout", "ok", "bad"])
    assert trail.count() == 3 and all(c.actor.startswith("cli:") for c in trail)
