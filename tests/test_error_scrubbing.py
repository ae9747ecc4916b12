"""Error text holds no personal data (issue 11, item 3).

A provider's 400 often echoes the contact it refused, and a workflow's error message quotes
whatever the failing node saw. Messages are stored in plaintext columns (an operation's
last_error, attempt messages, event reasons, DLQ error messages and notes) that operators
list and export long after the payload's retention: they are masked before storage by
ledger.platform.redaction.scrub, the same patterns the log pipeline uses, plus configured ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from alerts.models import Alert
from dlq.models import FailedEvent, FailedEventChange, Replay
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, Operation, OperationEvent
from ledger.platform.redaction import REDACTED, scrub
from ledger.protocol.services import sanitize_message
from relay.testing import RunningServer
from tests.execute.conftest import configure_provider
from tests.execute.support import run_due
from tests.ledger.support import CLAIM_URL, claim_body
from tests.support.fixtures import *  # noqa: F403

EMAIL = "priya.raman@example.invalid"
PHONE = "+61 412 345 678"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig"
API_KEY = "og_abcd1234_secretsecretsecret"
CUSTOMER = "CUST-00417733"
MARKERS = (EMAIL, "priya.raman", "412 345 678", TOKEN, API_KEY, "secretsecret")
ECHO = f"422: contact {EMAIL} ({PHONE}) already exists; Authorization: Bearer {TOKEN} key {API_KEY}"


def stored_error_text() -> str:
    """Every plaintext column that holds error text, notes or reasons, as one string."""
    rows: list[Any] = [
        *Operation.objects.values_list("last_error", flat=True),
        *Attempt.objects.values_list("message", flat=True),
        *OperationEvent.objects.values_list("reason", flat=True),
        *FailedEvent.objects.values_list("error_message", "status_note", "source_workflow_name"),
        *FailedEventChange.objects.values_list("note", flat=True),
        *Replay.objects.values_list("error_message", "note"),
        *Alert.objects.values_list("summary", flat=True),
    ]
    return json.dumps(rows, default=str)


def assert_no_marker(text: str) -> None:
    leaked = [marker for marker in MARKERS if marker in text]
    assert not leaked, (leaked, text[:2000])


# --- The function ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        (f"refused {EMAIL}", EMAIL),
        (f"call {PHONE} failed", "412 345 678"),
        ("call 0412 345 678 failed", "0412 345 678"),
        ("E.164 61412345678 unknown", "61412345678"),
        (f"Authorization: Bearer {TOKEN}", TOKEN),
        (f"bad key {API_KEY}", API_KEY),
        ("stripe sk_live_abcdefgh12345678 refused", "sk_live_abcdefgh12345678"),
        ("api_key=hunter2hunter2 rejected", "hunter2hunter2"),
    ],
)
def test_scrub_masks_contacts_tokens_and_keys(text, gone):
    scrubbed = scrub(text)

    assert gone not in scrubbed
    assert REDACTED in scrubbed


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 422 (12 ms)",
        "HTTP 201 with status 'pending'",
        "transient: retry scheduled",
        "superseded by operation 1234567",
        "replay #3 to crm-rerun",
        "order-1001:charge:v1 lease expired at 2026-01-01T00:00:00Z",
        "not delivered: ConnectTimeout",
    ],
)
def test_scrub_leaves_operational_text_alone(text):
    assert scrub(text) == text


def test_configured_identifier_patterns_are_masked_too(settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "ERROR_SCRUB_PATTERNS": [r"\bCUST-\d{8}\b"]}

    assert scrub(f"customer {CUSTOMER} unknown") == f"customer {REDACTED} unknown"


def test_a_message_is_masked_before_it_is_cut_so_no_half_address_survives():
    message = "x" * 490 + f" {EMAIL}"

    assert "priya" not in sanitize_message(message)


# --- Guard mode: the caller reports the provider's echo ----------------------------------------


@pytest.mark.django_db
def test_a_reported_failure_echoing_a_contact_is_stored_masked_everywhere(api, settings):
    settings.ONCEGUARD = {**settings.ONCEGUARD, "ERROR_SCRUB_PATTERNS": [r"\bCUST-\d{8}\b"]}
    created = api.post(CLAIM_URL, claim_body("lead-77:crm:create:v1"), format="json").json()

    failed = api.post(
        f"/api/v1/operations/{created['id']}/fail",
        {"lease_token": created["lease_token"], "error_class": "invalid_input", "message": f"{ECHO} {CUSTOMER}"},
        format="json",
    )

    assert failed.status_code == 200, failed.content
    assert failed.json()["status"] == "failed"
    assert "422: contact [redacted]" in failed.json()["last_error"]
    assert FailedEvent.objects.get().error_message == failed.json()["last_error"]
    text = stored_error_text()
    assert_no_marker(text)
    assert CUSTOMER not in text


# --- Execute mode: the provider's own answer ---------------------------------------------------


@pytest.mark.django_db
def test_a_provider_400_echoing_the_contact_leaves_no_personal_data_in_plaintext_columns(
    tenant, mock_advisory: RunningServer
):
    configure_provider(tenant, mock_advisory, slug="crm", enforced=False, ref_pointer="/id", status_pointer="")
    mock_advisory.script([{"status": 400, "body": {"error": ECHO, "contact": {"email": EMAIL, "phone": PHONE}}}])
    op = operation_submit(
        tenant=tenant,
        key="lead-77:crm:create:v1",
        provider="crm",
        request={"method": "POST", "path": "/contacts", "body": {"email": EMAIL, "phone": PHONE}},
    ).operation

    (done,) = run_due()

    assert done.pk == op.pk and done.status == "failed"
    assert FailedEvent.objects.filter(operation=op).exists()
    assert_no_marker(stored_error_text())


@pytest.mark.django_db
def test_a_provider_status_value_echoing_the_contact_is_masked_before_it_is_cut(tenant, mock_enforced: RunningServer):
    configure_provider(tenant, mock_enforced, slug="charges", enforced=True)
    # A 2xx whose status is not a success value: ambiguous, and its message quotes the status.
    mock_enforced.script([{"status": 201, "body": {"id": "ch_1", "status": f"held for {EMAIL}, call {PHONE}"}}])
    operation_submit(
        tenant=tenant,
        key="order-9:charge:v1",
        provider="charges",
        request={"method": "POST", "path": "/charges", "body": {"amount": 100}},
    )

    (done,) = run_due()

    assert done.status == "uncertain"
    assert "[redacted]" in done.last_error
    assert_no_marker(stored_error_text())


# --- DLQ ingest: the workflow's error message --------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body",
    [
        {"event_id": "e-1", "payload": {"email": EMAIL}, "error": ECHO},
        {"event_id": "e-2", "payload": {}, "error": {"message": ECHO, "class": "invalid_input"}},
        {
            "execution": {"id": "4812", "error": {"message": ECHO, "httpCode": "422"}, "lastNodeExecuted": "CRM"},
            "workflow": {"id": "17", "name": "Lead intake"},
        },
        {
            "trigger": {"error": {"message": ECHO, "cause": {"message": ECHO}, "node": {"name": "Webhook"}}},
            "workflow": {"id": "18", "name": "Inbound"},
        },
    ],
    ids=["envelope string", "envelope object", "n8n execution", "n8n trigger"],
)
def test_a_dlq_report_echoing_the_contact_is_stored_masked(api, body):
    response = api.generic("POST", "/api/v1/dlq/events", json.dumps(body), content_type="application/json")

    assert response.status_code == 201, response.content
    assert "[redacted]" in response.json()["error_message"]
    assert_no_marker(json.dumps(response.json()))
    assert_no_marker(stored_error_text())


@pytest.mark.django_db
def test_a_resolve_note_quoting_a_contact_is_stored_masked(api):
    created = api.generic(
        "POST", "/api/v1/dlq/events", json.dumps({"event_id": "e-9", "payload": {}}), content_type="application/json"
    ).json()

    resolved = api.post(f"/api/v1/dlq/events/{created['id']}/resolve", {"note": f"called {PHONE}, ok"}, format="json")

    assert resolved.status_code == 200, resolved.content
    assert_no_marker(stored_error_text())
