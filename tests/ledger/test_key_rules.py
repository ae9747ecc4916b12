"""Keys are printable ASCII (ledger.rules.key_rules): a new key that is not is refused at every
door with ``400 invalid_idempotency_key`` naming the rule; a key the ledger already holds
keeps being answered; a stored key that breaks the rule goes on the wire encoded. Claims
naming the service's own providers (slugs beginning with ``_``) are refused."""

from __future__ import annotations

import json
import string
from typing import Any

import httpx
import pytest
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.models import IdempotencyClass, Operation, Provider, Tombstone
from ledger.platform.errors import InvalidKey, ReservedProvider, ValidationFailed
from ledger.protocol import services
from ledger.protocol.callbacks import CALLBACK_PROVIDER_SLUG, callback_provider
from ledger.protocol.guard import run_once
from ledger.providers.adapters import prepare_request
from ledger.providers.reconcile import LookupOutcome, provider_lookup
from ledger.rules.key_rules import KEY_RULES, key_header_value, key_path_segment, key_rule_broken
from tests.ledger.support import CLAIM_URL, assert_problem, claim_body

pytestmark = pytest.mark.django_db

FULLWIDTH = "order-1001:\uff43harge:v1"  # a fullwidth ｃ
# (key, the rule it breaks)
REFUSED = [
    (FULLWIDTH, "printable_ascii"),
    ("order-1001\x07:charge", "printable_ascii"),
    ("x" * 256, "max_length"),
    ("", "required"),
]


def _refused(response: Any, rule: str) -> None:
    body = assert_problem(response, 400, "invalid_idempotency_key")
    assert body["rule"] == rule


@pytest.mark.parametrize(("key", "rule"), REFUSED)
def test_a_claim_with_a_key_that_breaks_the_rule_is_400_naming_the_rule_and_stores_nothing(api, key, rule):
    _refused(api.post(CLAIM_URL, claim_body(key), format="json"), rule)
    assert not Operation.objects.exists()


@pytest.mark.parametrize(("key", "rule"), [(k, r) for k, r in REFUSED if "\x07" not in k])
def test_the_same_keys_in_the_idempotency_key_header_are_refused_with_their_rule(api, key, rule):
    # A control character cannot travel in a header at all (the client refuses it).
    _refused(api.post(CLAIM_URL, claim_body(None), format="json", HTTP_IDEMPOTENCY_KEY=key), rule)


@pytest.mark.parametrize(("key", "rule"), REFUSED)
def test_a_submission_with_a_key_that_breaks_the_rule_is_refused_with_its_rule(api, key, rule):
    body = {"key": key, "provider": "stripe", "request": {"method": "POST", "path": "/charges", "body": {}}}
    _refused(api.post("/api/v1/operations", body, format="json"), rule)
    assert not Operation.objects.exists()


@pytest.mark.parametrize(("key", "rule"), REFUSED)
def test_the_in_process_guard_refuses_the_same_keys_before_calling_the_function(tenant, provider, key, rule):
    calls: list[int] = []
    with pytest.raises(InvalidKey) as refused:
        run_once(tenant=tenant, key=key, fn=lambda: calls.append(1), provider="stripe", action="charge")
    assert refused.value.extra["rule"] == rule
    assert calls == [] and not Operation.objects.exists()


def test_a_versioned_key_composed_from_non_ascii_parts_is_refused(api):
    body = claim_body(None, record="lead-\uff43", version=1)
    _refused(api.post(CLAIM_URL, body, format="json"), "printable_ascii")


def _store_key_directly(operation_id: int, key: str) -> None:
    # Past every door: as a key stored before the rule existed.
    Operation.objects.filter(pk=operation_id).update(key=key)


def test_a_stored_non_ascii_key_still_replays_its_recorded_outcome(api, tenant):
    first = api.post(CLAIM_URL, claim_body("order-1001:charge:v1"), format="json").json()
    _store_key_directly(first["id"], FULLWIDTH)
    services.operation_complete(
        operation_id=first["id"], lease_token=first["lease_token"], provider_ref="ch_1", tenant_id=tenant.pk
    )

    again = api.post(CLAIM_URL, claim_body(FULLWIDTH), format="json")

    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first["id"]


def test_a_stored_non_ascii_key_whose_row_retention_deleted_answers_from_its_tombstone(api, tenant):
    first = api.post(CLAIM_URL, claim_body("order-1001:charge:v1"), format="json").json()
    services.operation_complete(
        operation_id=first["id"], lease_token=first["lease_token"], provider_ref="ch_1", tenant_id=tenant.pk
    )
    op = Operation.objects.get(pk=first["id"])
    now = timezone.now()
    Tombstone.objects.create(
        tenant_id=tenant.pk,
        key=FULLWIDTH,
        mode=op.mode,
        action=op.action,
        fingerprint=op.fingerprint,
        final_status=op.status,
        provider_ref=op.provider_ref,
        response_status=op.response_status,
        created_at=op.created_at,
        done_at=op.done_at,
        operation_id=op.pk,
        provider_slug="stripe",
        deleted_at=now,
        keep_until=now + timezone.timedelta(days=1),
    )

    again = api.post(CLAIM_URL, claim_body(FULLWIDTH), format="json")

    assert again.status_code == 200, again.content
    assert again["Idempotent-Replayed"] == "true"


# --- Keys on the wire ---------------------------------------------------------------------


def test_a_stored_non_ascii_key_is_sent_percent_encoded_in_the_idempotency_header(tenant, provider):
    op = services.operation_claim(tenant=tenant, key="order-1:charge:v1", provider=provider).operation
    _store_key_directly(op.pk, FULLWIDTH)
    op.refresh_from_db()

    prepared = prepare_request(provider=provider, operation=op)

    header = prepared.headers[provider.idempotency_header]
    assert header == "order-1001:%EF%BD%83harge:v1"
    header.encode("ascii")


def test_a_reconciliation_lookup_of_a_stored_non_ascii_key_sends_it_encoded_and_gets_an_answer(tenant):
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "ch_1"})

    provider = services.provider_upsert(
        tenant=tenant,
        slug="stripe",
        base_url="http://127.0.0.1:9",
        lookup_path="/charges/{key}",
        idempotency_class=IdempotencyClass.KEY_ENFORCED,
    )
    op = services.operation_claim(tenant=tenant, key="order-1:charge:v1", provider=provider).operation
    _store_key_directly(op.pk, "a/\uff43\n")
    op.refresh_from_db()

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        result = provider_lookup(provider=provider, operation=op, client=client)

    assert result.outcome == LookupOutcome.FOUND
    assert seen[0].url.raw_path == b"/charges/a%2F%EF%BD%83%0A"
    assert seen[0].headers["Idempotency-Key"] == "a/%EF%BD%83%0A"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_the_key_rule_is_exactly_1_to_255_printable_ascii_without_surrounding_blanks(key):
    printable = all(0x20 <= ord(c) <= 0x7E for c in key)
    expected = 1 <= len(key) <= 255 and printable and key.strip() == key
    # personal_data (tests/ledger/test_key_personal_data.py) is waived here: this is the shape.
    assert (key_rule_broken(key, personal_data_allowed=True) is None) == expected
    # Whatever is stored, the header value is printable ASCII, and a valid key goes as is.
    value = key_header_value(key)
    assert all(0x20 <= ord(c) <= 0x7E for c in value)
    assert value.strip() == value
    if expected:
        assert value == key
    segment = key_path_segment(key)
    assert "/" not in segment and all(c in string.ascii_letters + string.digits + "%-._~" for c in segment)


def test_every_rule_has_a_stable_name_and_a_message():
    names = [rule.name for rule in KEY_RULES]
    assert len(set(names)) == len(names)
    assert {"required", "max_length", "printable_ascii", "personal_data"} <= set(names)
    assert all(rule.message for rule in KEY_RULES)


# --- The service's own providers ------------------------------------------------------------


def test_a_claim_naming_the_internal_callbacks_provider_is_refused(api, tenant):
    callback_provider(tenant_id=tenant.pk)
    response = api.post(CLAIM_URL, claim_body(provider=CALLBACK_PROVIDER_SLUG), format="json")
    assert_problem(response, 400, "reserved_provider")
    assert not Operation.objects.filter(provider__slug=CALLBACK_PROVIDER_SLUG).exists()


def test_a_submission_naming_the_internal_callbacks_provider_is_refused(api, tenant):
    callback_provider(tenant_id=tenant.pk)
    body = {"key": "k1", "provider": CALLBACK_PROVIDER_SLUG, "request": {"method": "POST", "path": "/", "body": {}}}
    assert_problem(api.post("/api/v1/operations", body, format="json"), 400, "reserved_provider")


def test_the_guard_refuses_an_underscore_provider(tenant):
    callback_provider(tenant_id=tenant.pk)
    with pytest.raises(ReservedProvider):
        run_once(tenant=tenant, key="k1", fn=lambda: None, provider=CALLBACK_PROVIDER_SLUG)


def test_a_tenant_cannot_create_a_provider_whose_slug_begins_with_an_underscore(tenant):
    with pytest.raises(ValidationFailed):
        services.provider_upsert(
            tenant=tenant, slug="_mine", base_url="http://127.0.0.1:9", idempotency_class=IdempotencyClass.KEY_ENFORCED
        )
    assert json.dumps(ReservedProvider.code) == '"reserved_provider"'


def test_a_console_form_cannot_create_or_rename_into_an_underscore_slug_but_the_service_own_one_still_saves(
    tenant, provider
):
    new = Provider(tenant=tenant, slug="_mine", base_url="http://127.0.0.1:9", idempotency_class="key_enforced")
    with pytest.raises(DjangoValidationError) as refused:
        new.clean()
    assert "slug" in refused.value.message_dict
    provider.slug = "_stripe"
    with pytest.raises(DjangoValidationError):
        provider.clean()
    own = callback_provider(tenant_id=tenant.pk)
    own.clean()
