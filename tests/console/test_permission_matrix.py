"""Permission matrix: every role × every console action × own / other tenant, and every API
scope × every API action × own / other tenant. "Allowed" is judged by the effect (a state
change, a row, a revealed value), not only by the HTTP status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dlq.models import FailedEvent, FailedEventStatus, Replay
from dlq.targets import services as dlq_targets
from ledger.models import ApiKey, Operation, OperationStatus, Provider, Tenant
from ledger.protocol import services
from review.models import AccessLog, ErasureRun, RetentionPolicy
from tests.console.support import (
    MARKERS,
    advisory_provider,
    client_for,
    enforced_provider,
    example,
    failed_op,
    op_in_review,
    staff,
)

pytestmark = pytest.mark.django_db

ROLES = ("operator", "reviewer", "auditor", "admin")


@dataclass
class World:
    review: Operation
    failed: Operation
    event: FailedEvent
    paused: Provider
    api_key: ApiKey


def _world(tenant: Tenant, tag: str) -> World:
    mailer = advisory_provider(tenant)
    crm = enforced_provider(tenant)
    dlq_targets.replay_target_upsert(tenant=tenant, slug="hook", url="http://127.0.0.1:9/hook", is_default=True)
    review = op_in_review(tenant, mailer, f"{tag}:review", payload=example("voice-call-analyzed.json"))
    failed = failed_op(tenant, crm, f"{tag}:failed", payload=example("crm-create-contact-request.json"))
    Provider.objects.filter(pk=crm.pk).update(paused_at=timezone.now(), paused_reason="HTTP 401")
    key, _ = services.apikey_create(tenant=tenant, scopes=["read"], name=f"{tag}-key")
    return World(review, failed, FailedEvent.objects.get(operation=failed), Provider.objects.get(pk=crm.pk), key)


@pytest.fixture
def worlds(tenant: Tenant, other_tenant: Tenant) -> dict[str, World]:
    return {"own": _world(tenant, "own"), "other": _world(other_tenant, "other")}


# --- Console: each action returns True when it took effect --------------------------------------


def view_operations(client: Client, w: World) -> bool:
    body = client.get("/admin/ledger/operation/").content.decode()
    return f"/admin/ledger/operation/{w.failed.pk}/change/" in body


def decide_review(client: Client, w: World) -> bool:
    client.post(f"/admin/review/reviewitem/{w.review.pk}/change/", {"decision": "abandon", "note": "matrix"})
    return Operation.objects.get(pk=w.review.pk).status == OperationStatus.ABANDONED


def replay_dlq(client: Client, w: World) -> bool:
    client.post(f"/admin/dlq/failedevent/{w.event.pk}/replay/", {"note": "matrix", "target": ""})
    return Replay.objects.filter(event=w.event).exists()


def resolve_dlq(client: Client, w: World) -> bool:
    client.post(f"/admin/dlq/failedevent/{w.event.pk}/resolve/", {"note": "fixed in the CRM by hand"})
    return FailedEvent.objects.get(pk=w.event.pk).status == FailedEventStatus.RESOLVED


def resume_provider(client: Client, w: World) -> bool:
    client.post("/admin/review/pausedprovider/", {"action": "resume", "_selected_action": [w.paused.pk], "index": 0})
    return Provider.objects.get(pk=w.paused.pk).paused_at is None


def revoke_api_key(client: Client, w: World) -> bool:
    client.post("/admin/ledger/apikey/", {"action": "revoke", "_selected_action": [w.api_key.pk], "index": 0})
    return ApiKey.objects.get(pk=w.api_key.pk).revoked_at is not None


def reveal_payload(client: Client, w: World) -> bool:
    response = client.post(
        f"/admin/onceguard/reveal/ledger/operation/{w.failed.pk}/",
        {"fields_wanted": ["payload"], "reason": "permission matrix check"},
    )
    shown = "Priya" in response.content.decode()
    assert shown == AccessLog.objects.filter(action="reveal").exists()
    return shown


def export_csv(client: Client, w: World) -> bool:
    response = client.get("/admin/ledger/operation/export.csv")
    if response.status_code != 200:
        return False
    text = b"".join(response.streaming_content).decode()
    assert not any(m in text for m in MARKERS)
    return w.failed.key in text


def read_access_log(client: Client, w: World) -> bool:
    from review.privacy import payloads as privacy

    privacy.accesslog_append(
        tenant_id=w.failed.tenant_id, action="reveal", actor="user:someone", object_type="x", reason="seeded row here"
    )
    return "seeded row here" in client.get("/admin/review/accesslog/").content.decode()


def subject_search(client: Client, w: World) -> bool:
    response = client.post("/admin/onceguard/subjects/", {"phone": "+61412345678", "reason": "matrix subject check"})
    return response.status_code == 200 and w.failed.key in response.content.decode()


def subject_trail(client: Client, w: World) -> bool:
    form = {"tenant": w.failed.tenant_id, "phone": "+61412345678", "reason": "matrix trail check", "action": "trail"}
    response = client.post("/admin/onceguard/subjects/trail/", form)
    return response.status_code == 200 and w.failed.key in response.content.decode()


def export_subject_in_clear(client: Client, w: World) -> bool:
    form = {"tenant": w.failed.tenant_id, "phone": "+61412345678", "reason": "matrix export check"}
    response = client.post("/admin/onceguard/subjects/trail/", {**form, "action": "export_json", "decrypt": "on"})
    return response.status_code == 200 and "Priya" in response.content.decode()


def erase_subject(client: Client, w: World) -> bool:
    form = {"tenant": w.failed.tenant_id, "phone": "+61412345678", "reason": "matrix erase check"}
    client.post("/admin/onceguard/subjects/trail/", {**form, "action": "erase", "confirm_erase": "on"})
    return ErasureRun.objects.filter(tenant_id=w.failed.tenant_id).exists()


def configure_retention(client: Client, w: World) -> bool:
    client.post(
        "/admin/review/retentionpolicy/add/",
        {"tenant": w.failed.tenant_id, "record_type": "access_log", "payload_ttl": "", "record_ttl": "400 00:00:00"},
    )
    return RetentionPolicy.objects.filter(tenant_id=w.failed.tenant_id, record_type="access_log").exists()


CONSOLE_ACTIONS = {
    "view_operations": (view_operations, {"operator", "reviewer", "auditor", "admin"}),
    "decide_review": (decide_review, {"reviewer", "admin"}),
    "replay_dlq": (replay_dlq, {"operator", "admin"}),
    "resolve_dlq": (resolve_dlq, {"operator", "admin"}),
    "resume_provider": (resume_provider, {"operator", "admin"}),
    "revoke_api_key": (revoke_api_key, {"admin"}),
    "reveal_payload": (reveal_payload, {"admin"}),
    "export_csv": (export_csv, {"auditor", "admin"}),
    "read_access_log": (read_access_log, {"auditor", "admin"}),
    "subject_search": (subject_search, {"auditor", "admin"}),
    "subject_trail": (subject_trail, {"auditor", "admin"}),
    # Data in clear is a reveal: admins only (auditors see who looked, not the data).
    "export_subject_in_clear": (export_subject_in_clear, {"admin"}),
    "erase_subject": (erase_subject, {"admin"}),
    "configure_retention": (configure_retention, {"admin"}),
}


@pytest.mark.parametrize("whose", ["own", "other"])
@pytest.mark.parametrize("action", sorted(CONSOLE_ACTIONS))
@pytest.mark.parametrize("role", ROLES)
def test_console_matrix(role: str, action: str, whose: str, worlds: dict[str, World], tenant: Tenant) -> None:
    user = staff(f"{role}-user", role=role, tenants=[tenant])
    fn, allowed_roles = CONSOLE_ACTIONS[action]
    expected = role in allowed_roles and whose == "own"
    assert fn(client_for(user), worlds[whose]) is expected


def test_superuser_may_do_everything_everywhere(worlds: dict[str, World]) -> None:
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    for name, (fn, _) in sorted(CONSOLE_ACTIONS.items()):
        assert fn(root, worlds["other"]) is True, name


# --- API: each scope × action × own/other tenant ---------------------------------------------------


def api_list_operations(api: Any, w: World) -> bool:
    r = api.get("/api/v1/operations")
    return r.status_code == 200 and any(o["id"] == w.failed.pk for o in r.json()["results"])


def api_get_operation(api: Any, w: World) -> bool:
    return api.get(f"/api/v1/operations/{w.failed.pk}").status_code == 200


def api_claim(api: Any, w: World) -> bool:
    slug = Provider.objects.filter(tenant_id=w.failed.tenant_id, slug="mailer").values_list("slug", flat=True).first()
    r = api.post("/api/v1/claims", {"key": f"new-{w.failed.pk}", "provider": slug}, format="json")
    return (
        r.status_code == 201
        and Operation.objects.filter(key=f"new-{w.failed.pk}", tenant_id=w.failed.tenant_id).exists()
    )


def api_decide_review(api: Any, w: World) -> bool:
    api.post(f"/api/v1/review/items/{w.review.pk}/decision", {"decision": "abandon", "note": "matrix"}, format="json")
    return Operation.objects.get(pk=w.review.pk).status == OperationStatus.ABANDONED


def api_reveal(api: Any, w: World) -> bool:
    r = api.post(f"/api/v1/operations/{w.failed.pk}/payload", {"reason": "matrix api check"}, format="json")
    return r.status_code == 200 and "Priya" in r.content.decode()


def api_dlq_resolve(api: Any, w: World) -> bool:
    api.post(f"/api/v1/dlq/events/{w.event.pk}/resolve", {"note": "fixed by hand"}, format="json")
    return FailedEvent.objects.get(pk=w.event.pk).status == FailedEventStatus.RESOLVED


def api_subject_trail(api: Any, w: World) -> bool:
    body = {"identifiers": {"phone": "+61412345678"}, "reason": "matrix api trail"}
    r = api.post("/api/v1/subjects/trail", body, format="json")
    return r.status_code == 200 and any(rec["ref"] == w.failed.key for rec in r.json()["records"])


def api_subject_export_in_clear(api: Any, w: World) -> bool:
    body = {"identifiers": {"phone": "+61412345678"}, "reason": "matrix api export", "decrypt": True}
    r = api.post("/api/v1/subjects/export", body, format="json")
    return r.status_code == 200 and "Priya" in r.content.decode()


def api_subject_erase(api: Any, w: World) -> bool:
    body = {"identifiers": {"phone": "+61412345678"}, "reason": "matrix api erase"}
    api.post("/api/v1/subjects/erasures", body, format="json")
    return ErasureRun.objects.filter(tenant_id=w.failed.tenant_id).exists()


API_ACTIONS = {
    "list_operations": (api_list_operations, {"read", "admin"}),
    "get_operation": (api_get_operation, {"read", "admin"}),
    "claim": (api_claim, {"write", "admin"}),
    "decide_review": (api_decide_review, {"write", "admin"}),
    "dlq_resolve": (api_dlq_resolve, {"write", "admin"}),
    # Not implied by admin: payloads need the explicit `payload` scope.
    "reveal_payload": (api_reveal, {"payload"}),
    # A person's trail: `audit`, implied by `admin`; in clear it needs `payload` as well, so
    # no single scope is enough; an erasure is an admin's.
    "subject_trail": (api_subject_trail, {"audit", "admin"}),
    "subject_export_in_clear": (api_subject_export_in_clear, set()),
    "subject_erase": (api_subject_erase, {"admin"}),
}


@pytest.mark.parametrize("whose", ["own", "other"])
@pytest.mark.parametrize("action", sorted(API_ACTIONS))
@pytest.mark.parametrize("scope", ["read", "write", "admin", "payload", "audit"])
def test_api_matrix(
    scope: str, action: str, whose: str, worlds: dict[str, World], tenant: Tenant, make_client: Any
) -> None:
    api = make_client(tenant, [scope])
    fn, allowed = API_ACTIONS[action]
    assert fn(api, worlds[whose]) is (scope in allowed and whose == "own")


def test_a_revoked_key_can_do_nothing(worlds: dict[str, World], tenant: Tenant) -> None:
    from rest_framework.test import APIClient

    key, secret = services.apikey_create(tenant=tenant, scopes=["read", "write", "admin", "payload"])
    services.apikey_revoke(api_key_id=key.pk)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    for name, (fn, _) in API_ACTIONS.items():
        assert fn(api, worlds["own"]) is False, name


def test_role_groups_carry_their_permissions() -> None:
    from django.contrib.auth.models import Group

    perms = {
        g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()} for g in Group.objects.all()
    }
    assert "review.decide_reviewitem" in perms["reviewer"] and "dlq.replay_failedevent" not in perms["reviewer"]
    assert {"dlq.replay_failedevent", "dlq.resolve_failedevent", "review.resume_provider"} <= perms["operator"]
    assert {"review.view_accesslog", "review.view_retentionrun", "review.export_data"} <= perms["auditor"]
    assert not any(p.startswith(("ledger.change_", "dlq.change_", "ledger.add_")) for p in perms["auditor"])
    assert "review.view_payload" in perms["admin"] and all("review.view_payload" not in perms[r] for r in ROLES[:3])
    never = {
        "change_operation",
        "add_operation",
        "delete_operation",
        "change_accesslog",
        "delete_accesslog",
        "delete_attempt",
        "change_operationevent",
    }
    assert not any(p.split(".")[1] in never for ps in perms.values() for p in ps)
