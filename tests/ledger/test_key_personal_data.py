"""Keys carry no personal data (ledger.rules.key_rules, rule ``personal_data``): a new key holding an
e-mail address or an international phone number is refused at every door with ``400
invalid_idempotency_key``, with the patterns ledger.platform.redaction masks in free text; record ids
stay valid; a key the ledger holds keeps being answered; the tenant's platform-owned setting
allows such keys; the DLQ keeps an entry whose key has personal data as "no usable key"."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from dlq.ingest.parsing import failed_request_key
from ledger.models import Operation, Tenant
from ledger.platform import redaction
from ledger.platform.errors import InvalidKey
from ledger.protocol import services
from ledger.protocol.guard import run_once
from ledger.rules.key_rules import PERSONAL_DATA, key_rule_broken, key_usable
from tests.console.support import client_for, staff, submit_form
from tests.ledger.support import CLAIM_URL, assert_problem, claim_body

pytestmark = pytest.mark.django_db

PERSONAL = [
    "lead:jane.doe@example.com:create",
    "jane+crm@example.co.uk",
    "contact:+61412345678",
    "sms:+1 (555) 010-0199:v1",
    "+442071838750",
]
RECORD_IDS = [
    "order-12345678901",
    "1700000000",
    "a+b",
    "sku+12:v3",
    "order-1001:charge:v1",
    "user@host",  # no domain with a dot: not an address
    "invoice-0412345678",
]


def _submission(key: str) -> dict[str, Any]:
    return {"key": key, "provider": "stripe", "request": {"method": "POST", "path": "/charges", "body": {}}}


@pytest.mark.parametrize("key", PERSONAL)
def test_a_key_with_an_email_address_or_international_phone_number_breaks_the_personal_data_rule(key):
    broken = key_rule_broken(key)
    assert broken is not None and broken.name == PERSONAL_DATA
    assert key_rule_broken(key, personal_data_allowed=True) is None


@pytest.mark.parametrize("key", RECORD_IDS)
def test_record_ids_and_a_plus_inside_a_token_stay_valid_keys(key):
    assert key_rule_broken(key) is None


def test_the_rule_uses_the_patterns_the_redaction_masks_with():
    for key in PERSONAL:
        assert redaction.EMAIL_ADDRESS.search(key) or redaction.PHONE_INTERNATIONAL.search(key)
        assert redaction.REDACTED in redaction.redact_text(key)


@pytest.mark.parametrize("key", PERSONAL[:3])
def test_a_claim_with_personal_data_in_its_key_is_400_naming_the_rule_and_stores_nothing(api, key):
    body = assert_problem(api.post(CLAIM_URL, claim_body(key), format="json"), 400, "invalid_idempotency_key")
    assert body["rule"] == PERSONAL_DATA
    assert not Operation.objects.exists()


def test_the_same_key_in_the_idempotency_key_header_is_refused(api):
    response = api.post(CLAIM_URL, claim_body(None), format="json", HTTP_IDEMPOTENCY_KEY=PERSONAL[0])
    assert assert_problem(response, 400, "invalid_idempotency_key")["rule"] == PERSONAL_DATA


def test_a_versioned_key_whose_record_is_an_email_address_is_refused(api):
    body = claim_body(None, record="jane.doe@example.com", version=1)
    response = api.post(CLAIM_URL, body, format="json")
    assert assert_problem(response, 400, "invalid_idempotency_key")["rule"] == PERSONAL_DATA


def test_a_submission_with_a_phone_number_in_its_key_is_refused(api):
    response = api.post("/api/v1/operations", _submission("sms:+61412345678"), format="json")
    assert assert_problem(response, 400, "invalid_idempotency_key")["rule"] == PERSONAL_DATA
    assert not Operation.objects.exists()


def test_the_in_process_guard_refuses_it_before_calling_the_function(tenant, provider):
    calls: list[int] = []
    with pytest.raises(InvalidKey) as refused:
        run_once(tenant=tenant, key=PERSONAL[0], fn=lambda: calls.append(1), provider="stripe", action="charge")
    assert refused.value.extra["rule"] == PERSONAL_DATA
    assert calls == []


@pytest.mark.parametrize("key", RECORD_IDS[:3])
def test_a_claim_with_a_record_id_key_is_accepted(api, key):
    assert api.post(CLAIM_URL, claim_body(key), format="json").status_code == 201


def test_a_stored_key_with_personal_data_keeps_being_answered(api, tenant):
    first = api.post(CLAIM_URL, claim_body("order-1001:charge:v1"), format="json").json()
    Operation.objects.filter(pk=first["id"]).update(key=PERSONAL[0])  # stored before the rule
    services.operation_complete(
        operation_id=first["id"], lease_token=first["lease_token"], provider_ref="ch_1", tenant_id=tenant.pk
    )

    again = api.post(CLAIM_URL, claim_body(PERSONAL[0]), format="json")

    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first["id"]


def test_a_tenant_that_allows_personal_data_in_keys_may_claim_and_submit_them(api, tenant, provider):
    Tenant.objects.filter(pk=tenant.pk).update(personal_data_in_keys_allowed=True)

    assert api.post(CLAIM_URL, claim_body(PERSONAL[0]), format="json").status_code == 201
    assert api.post("/api/v1/operations", _submission(PERSONAL[2]), format="json").status_code in (200, 201, 202)
    tenant.refresh_from_db()
    assert run_once(tenant=tenant, key=PERSONAL[3], fn=lambda: "done", provider="stripe", action="charge") == "done"


def test_the_setting_of_one_tenant_does_not_allow_them_for_another(api, tenant, other_tenant, make_client):
    Tenant.objects.filter(pk=other_tenant.pk).update(personal_data_in_keys_allowed=True)
    response = api.post(CLAIM_URL, claim_body(PERSONAL[0]), format="json")
    assert assert_problem(response, 400, "invalid_idempotency_key")["rule"] == PERSONAL_DATA


def test_other_rules_still_apply_where_personal_data_is_allowed(api, tenant):
    Tenant.objects.filter(pk=tenant.pk).update(personal_data_in_keys_allowed=True)
    response = api.post(CLAIM_URL, claim_body(" jane@example.com"), format="json")
    assert assert_problem(response, 400, "invalid_idempotency_key")["rule"] == "no_surrounding_blanks"


def test_the_dlq_keeps_a_key_with_personal_data_as_no_usable_key():
    assert key_usable(PERSONAL[0]) == ""
    derived = failed_request_key(headers={"idempotency-key": PERSONAL[2]}, body={})
    assert derived.key == ""
    assert "no usable key" in derived.note and "e-mail" in derived.note


# --- The console: a platform-owned setting --------------------------------------------------


def test_a_tenant_admin_sees_the_setting_but_cannot_change_it_a_superuser_can(tenant):
    url = f"/admin/ledger/tenant/{tenant.pk}/change/"
    ada = client_for(staff("ada", role="admin", tenants=[tenant]))

    assert ada.get(url).status_code == 200
    response = submit_form(ada, url, personal_data_in_keys_allowed="on")
    # Tenants are the platform's: a tenant admin's page is read-only and a POST is refused.
    assert response.status_code == 403
    tenant.refresh_from_db()
    assert tenant.personal_data_in_keys_allowed is False

    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    assert submit_form(root, url, personal_data_in_keys_allowed="on").status_code == 302
    tenant.refresh_from_db()
    assert tenant.personal_data_in_keys_allowed is True
