"""Intent envelopes (DESIGN §5, intents) against a real loopback provider: a submission says
what it wants in the tenant's terms, the adapter revision's request template translates it
when the attempt is sent, and what the provider receives is that translation — never the
intent, never a rounded value, never a template that evaluated anything."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import OperationalError

from dlq.models import FailedEvent, ReplayOutcome
from dlq.replays.services import failed_event_replay
from ledger.execution import translation, uploads
from ledger.execution.submission import operation_submit
from ledger.models import Attempt, ErrorClass, Operation, OperationStatus, Provider, Tenant
from ledger.platform.crypto import open_json
from ledger.platform.errors import DomainError
from ledger.protocol.services import provider_upsert
from ledger.providers import canary, prompts
from ledger.rules.intents import RequestTemplateInvalid
from tests.execute.conftest import configure_provider
from tests.execute.support import RenderApi, make_due, run_due
from tests.support.objects import image_bytes, noisy_png

S = OperationStatus

SCHEMA: dict[str, Any] = {
    "fields": {
        "preset_id": {"type": "enum", "values": ["studio", "outdoor"], "required": True},
        "preset_version": {"type": "integer", "min": 1, "max": 100, "required": True},
        "aspect_class": {"type": "enum", "values": ["square", "portrait", "landscape"], "required": True},
        "source": {"type": "upload"},
        "hd": {"type": "boolean"},
        "strength": {"type": "number", "min": 0, "max": 1},
        "description": {"type": "string", "max_length": 200},
    }
}
SIZES = {"square": "1024x1024", "portrait": "768x1024", "landscape": "1024x768"}
TEMPLATE: dict[str, Any] = {
    "method": "POST",
    "path": "/v1/presets/{{ preset_id }}/renders",
    "body": {
        "model": "imagen-3.0-generate",
        "preset_version": "{{ preset_version }}",
        "size": "{{ size }}",
        "label": "preset {{ preset_id }} v{{ preset_version }} at {{ size }}",
        "image": {"key": "{{ source_key }}", "sha256": "{{ source_sha256 }}"},
        "hd": "{{ hd }}",
        "strength": "{{ strength }}",
    },
    "lookups": {"size": {"field": "aspect_class", "values": SIZES}},
}
INTENT = {"preset_id": "studio", "preset_version": 3, "aspect_class": "portrait", "hd": True, "strength": 0.5}


@pytest.fixture
def renders(tenant: Tenant, render_api: RenderApi) -> Provider:
    return configure_provider(
        tenant,
        render_api.url,
        slug="renders",
        enforced=True,
        lookup_path="",
        intent_schema=SCHEMA,
        request_template=TEMPLATE,
    )


def submit(client, intent: dict[str, Any], key: str = "render-1:v1", **extra: Any):
    return client.post(
        "/api/v1/operations", {"key": key, "provider": "renders", "intent": intent, **extra}, format="json"
    )


def upload_of(tenant: Tenant, data: bytes):
    return uploads.upload_store(tenant=tenant, stream=io.BytesIO(data)).upload


# --- What the provider receives -----------------------------------------------------------------


def test_the_provider_receives_the_revisions_translation_of_the_intent_typed_and_never_the_intent(
    api, tenant, renders, render_api
):
    png = image_bytes(10, 10)
    source = upload_of(tenant, png)
    intent = {**INTENT, "source_key": source.key, "source_sha256": source.sha256}

    response = submit(api, intent)

    assert response.status_code == 202, response.json()
    op = Operation.objects.get()
    assert op.status == S.QUEUED and op.adapter_revision.number == 1
    run_due()
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED and op.provider_ref == "job_1"
    (sent,) = render_api.received
    assert sent["path"] == "/v1/presets/studio/renders"
    assert sent["headers"]["idempotency-key"] == "render-1:v1"
    assert sent["body"] == {
        "model": "imagen-3.0-generate",
        # A whole-string placeholder keeps the value's type; one inside text becomes text.
        "preset_version": 3,
        "size": "768x1024",
        "label": "preset studio v3 at 768x1024",
        "image": {"key": source.key, "sha256": source.sha256},
        "hd": True,
        "strength": 0.5,
    }


def test_an_optional_value_left_out_is_sent_as_null_and_as_empty_text(api, renders, render_api):
    assert submit(api, {"preset_id": "outdoor", "preset_version": 1, "aspect_class": "square"}).status_code == 202
    run_due()
    (sent,) = render_api.received
    assert sent["body"]["image"] == {"key": None, "sha256": None} and sent["body"]["hd"] is None
    assert sent["body"]["size"] == "1024x1024"


def test_a_value_placed_in_the_path_is_percent_encoded_whole_and_cannot_leave_its_segment(api, tenant, render_api):
    # An enum's values are the tenant's, yet still placed as data: encoded whole, never as syntax.
    schema = {"fields": {"name": {"type": "enum", "values": ["../../admin?x=1#f", "plain"], "required": True}}}
    template = {"method": "POST", "path": "/v1/items/{{ name }}", "body": {"name": "{{ name }}"}}
    configure_provider(
        tenant,
        render_api.url,
        slug="renders",
        enforced=True,
        lookup_path="",
        intent_schema=schema,
        request_template=template,
    )
    assert submit(api, {"name": "../../admin?x=1#f"}).status_code == 202
    run_due()
    (sent,) = render_api.received
    assert sent["path"] == "/v1/items/..%2F..%2Fadmin%3Fx%3D1%23f"
    assert sent["body"] == {"name": "../../admin?x=1#f"}


def test_a_value_that_looks_like_a_placeholder_is_sent_as_text_never_read_again(api, renders, render_api):
    prompts.prompt_template_create(
        tenant=renders.tenant,
        name="note",
        text="Note:\n{{ description }}",
        slots={"description": {"max_length": 200}},
        actor="x",
    )
    with_text = {**TEMPLATE, "body": {**TEMPLATE["body"], "note": "{{ prompt:note }}"}}
    provider_upsert(tenant=renders.tenant, slug="renders", request_template=with_text)
    text = "{{ preset_id }} {{ prompt:x }} {% if 1 %}"
    assert submit(api, {**INTENT, "description": text}).status_code == 202
    run_due()
    (sent,) = render_api.received
    assert sent["body"]["note"].startswith("Note:\n") and f"\n{text}\n" in sent["body"]["note"]


# --- What a submission may say ------------------------------------------------------------------


@pytest.mark.parametrize("aspect", ["squareish", "Square", "square ", "1024x1024", 1])
def test_an_unknown_aspect_class_is_a_400_and_nothing_is_written_or_sent(api, renders, render_api, aspect):
    response = submit(api, {**INTENT, "aspect_class": aspect})

    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "intent_value_not_allowed"
    assert body["field"] == "aspect_class" and body["allowed"] == ["square", "portrait", "landscape"]
    assert response["Content-Type"].startswith("application/problem+json")
    assert Operation.objects.count() == 0 and Attempt.objects.count() == 0
    run_due()
    assert render_api.received == []


@pytest.mark.parametrize(
    "intent",
    [
        {**INTENT, "size": "1024x1024"},  # the provider's own field name
        {**INTENT, "model": "imagen-3.0-generate"},
        {**INTENT, "source": {"key": "up_x"}},  # an upload is sent as source_key + source_sha256
    ],
)
def test_an_unknown_intent_field_is_a_400_with_its_name(api, renders, intent):
    response = submit(api, intent)

    assert response.status_code == 400
    assert response.json()["code"] == "intent_unknown_field"
    assert set(response.json()["fields"]) <= {"size", "model", "source"}
    assert Operation.objects.count() == 0


@pytest.mark.parametrize(
    ("intent", "field"),
    [
        ({k: v for k, v in INTENT.items() if k != "preset_version"}, "preset_version"),
        ({**INTENT, "preset_version": 0}, "preset_version"),
        ({**INTENT, "preset_version": "3"}, "preset_version"),
        ({**INTENT, "preset_version": True}, "preset_version"),
        ({**INTENT, "hd": "yes"}, "hd"),
        ({**INTENT, "strength": 1.5}, "strength"),
        ({**INTENT, "description": "x" * 201}, "description"),
    ],
)
def test_a_value_of_the_wrong_type_range_or_length_is_a_400_intent_invalid(api, renders, intent, field):
    response = submit(api, intent)

    assert response.status_code == 400 and response.json()["code"] == "intent_invalid"
    assert response.json()["field"] == field
    assert Operation.objects.count() == 0


def test_a_request_for_an_intent_provider_and_an_intent_for_a_request_provider_are_refused(
    api, renders, enforced, charge_envelope
):
    as_request = api.post(
        "/api/v1/operations", {"key": "k1", "provider": "renders", "request": charge_envelope()}, format="json"
    )
    as_intent = api.post("/api/v1/operations", {"key": "k2", "provider": "charges", "intent": INTENT}, format="json")

    assert (as_request.status_code, as_request.json()["code"]) == (400, "intent_required")
    assert (as_intent.status_code, as_intent.json()["code"]) == (400, "intent_not_accepted")
    assert Operation.objects.count() == 0


def test_the_fingerprint_covers_the_intent_and_the_stored_intent_is_what_was_sent(api, renders):
    first = submit(api, INTENT)
    again = submit(api, dict(reversed(list(INTENT.items()))))
    other = submit(api, {**INTENT, "aspect_class": "square"})

    assert first.status_code == 202 and again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422 and other.json()["code"] == "key_reused_with_different_request"
    op = Operation.objects.get()
    assert open_json(op.request) == {"intent": INTENT}


# --- Uploads named by an intent -------------------------------------------------------------------


def test_an_upload_reference_to_another_tenants_upload_or_with_a_wrong_digest_is_a_400(
    api, tenant, other_tenant, renders
):
    png = image_bytes(9, 9)
    theirs = upload_of(other_tenant, png)
    ours = upload_of(tenant, image_bytes(9, 8))

    cases = [
        {"source_key": theirs.key, "source_sha256": theirs.sha256},  # another tenant's upload
        {"source_key": ours.key, "source_sha256": theirs.sha256},  # our key, a wrong digest
        {"source_key": "up_" + "0" * 64, "source_sha256": "0" * 64},  # no such upload
        {"source_key": ours.key},  # half a reference
        {"source_key": ours.key.upper(), "source_sha256": ours.sha256},
    ]
    for n, ref in enumerate(cases):
        response = submit(api, {**INTENT, **ref}, key=f"render-{n}:v1")
        assert (response.status_code, response.json()["code"]) == (400, "upload_reference_invalid"), ref
    assert Operation.objects.count() == 0

    accepted = submit(api, {**INTENT, "source_key": ours.key, "source_sha256": ours.sha256})
    assert accepted.status_code == 202
    op = Operation.objects.get()
    # Admission's queued bytes count the upload the worker will send for it (DESIGN §11).
    assert op.request_bytes > ours.size


def test_admission_counts_the_referenced_upload_bytes_in_the_tenants_queued_bytes(api, tenant, renders):
    source = upload_of(tenant, noisy_png(64, 64))
    intent = {**INTENT, "source_key": source.key, "source_sha256": source.sha256}
    Tenant.objects.filter(pk=tenant.pk).update(max_queued_bytes=source.size + 2000)

    first = submit(api, intent, key="render-1:v1")
    second = submit(api, intent, key="render-2:v1")

    assert first.status_code == 202
    # Its envelope alone is far under the limit; with the upload's bytes it is over.
    assert second.status_code == 429 and second.json()["code"] == "tenant_queued_bytes_limit"
    assert Operation.objects.count() == 1
    assert second.json()["current"] == Operation.objects.get().request_bytes >= source.size
    # A repeat of the admitted one is never refused.
    assert submit(api, intent, key="render-1:v1").status_code == 202


# --- The request template on save -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{{ preset_id.__class__ }}",
        "{{ preset_id|upper }}",
        "{{ preset_id | upper }}",
        "{{ 1 + 1 }}",
        "{{ preset_id() }}",
        "{{ __import__ }}",
        "{{ preset_id[0] }}",
        "{% if hd %}hd{% endif %}",
        "{# comment #}",
        "${preset_id}",
        "{preset_id}",
        "preset {{ preset_id }",
        "{{{ preset_id }}}",
    ],
)
def test_a_template_that_would_evaluate_anything_is_refused_on_save(tenant, renders, text):
    template = {**TEMPLATE, "body": {**TEMPLATE["body"], "note": text}}

    with pytest.raises(RequestTemplateInvalid) as refused:
        provider_upsert(tenant=tenant, slug="renders", request_template=template)
    assert refused.value.code == "request_template_invalid" and refused.value.status == 400
    assert "request_template.body.note" in refused.value.detail
    # Nothing changed: no new revision, the stored template is the old one.
    renders.refresh_from_db()
    assert renders.request_template == TEMPLATE and renders.revisions.count() == 1
    # The console form's path (Provider.clean, through full_clean) refuses it on the field.
    renders.request_template = template
    with pytest.raises(ValidationError) as invalid:
        renders.full_clean()
    assert "request_template" in invalid.value.message_dict


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ({**TEMPLATE, "lookups": {"size": {"field": "aspect_class", "values": {"square": "1x1"}}}}, "missing"),
        ({**TEMPLATE, "body": {"x": "{{ seed }}"}}, "neither an intent field nor a lookup"),
        ({**TEMPLATE, "body": {"{{ preset_id }}": 1}}, "literal"),
        ({**TEMPLATE, "method": "{{ preset_id }}"}, "method"),
        ({**TEMPLATE, "script": "x"}, "unknown parts"),
        ({**TEMPLATE, "body": {"p": "{{ prompt:nope }}"}}, "does not exist"),
    ],
)
def test_a_template_that_cannot_translate_every_allowed_value_is_refused_on_save(tenant, renders, template, says):
    with pytest.raises(RequestTemplateInvalid) as refused:
        provider_upsert(tenant=tenant, slug="renders", request_template=template)
    assert says in refused.value.detail


def test_a_schema_without_a_template_and_a_bad_schema_are_refused(tenant, render_api):
    with pytest.raises(RequestTemplateInvalid, match="needs a request template"):
        configure_provider(tenant, render_api.url, slug="r2", enforced=True, lookup_path="", intent_schema=SCHEMA)
    bad = {"fields": {"prompt": {"type": "string"}}}  # a string needs its max_length
    with pytest.raises(RequestTemplateInvalid, match="max_length"):
        configure_provider(
            tenant,
            render_api.url,
            slug="r3",
            enforced=True,
            lookup_path="",
            intent_schema=bad,
            request_template={"path": "/"},
        )
    assert not Provider.objects.filter(slug__in=["r2", "r3"]).exists()


# --- Revisions: the translation is versioned with the adapter -------------------------------------


def test_a_canary_and_its_rollback_change_the_translation_per_revision(api, tenant, renders, render_api):
    v2 = {
        **TEMPLATE,
        "path": "/v2/renders",
        "lookups": {
            "size": {"field": "aspect_class", "values": {"square": "1:1", "portrait": "3:4", "landscape": "4:3"}}
        },
    }
    v2["body"] = {"aspect_ratio": "{{ size }}", "preset": "{{ preset_id }}"}
    provider = provider_upsert(
        tenant=tenant, slug="renders", request_template=v2, canary_percent=100, reason="API v2", actor="user:alice"
    )
    assert provider.request_template == TEMPLATE  # the row keeps the stable revision's

    assert submit(api, INTENT, key="on-canary:v1").status_code == 202
    run_due()
    (on_canary,) = render_api.received
    assert on_canary["path"] == "/v2/renders" and on_canary["body"] == {"aspect_ratio": "3:4", "preset": "studio"}

    # Queued under the canary, then the canary is rolled back: it goes out in revision 1's terms.
    assert submit(api, INTENT, key="queued:v1").status_code == 202
    assert Operation.objects.get(key="queued:v1").adapter_revision.number == 2
    canary.revision_rollback(provider_id=provider.pk, number=None, actor="user:alice", reason="v2 renders blurry")
    run_due()
    after = render_api.received[1]
    assert after["path"] == "/v1/presets/studio/renders" and after["body"]["size"] == "768x1024"
    assert Operation.objects.get(key="queued:v1").adapter_revision.number == 1
    assert [a.adapter_revision.number for a in Attempt.objects.filter(operation__key="queued:v1")] == [1]


def test_a_stored_intent_the_running_revision_refuses_fails_invalid_input_without_sending(
    api, tenant, renders, render_api
):
    assert submit(api, {**INTENT, "aspect_class": "landscape"}).status_code == 202
    # Revision 2 drops the landscape class (and its translation) while the row waits.
    fields = {**SCHEMA["fields"], "aspect_class": {"type": "enum", "values": ["square", "portrait"], "required": True}}
    narrower = {
        **TEMPLATE,
        "lookups": {"size": {"field": "aspect_class", "values": {"square": "1024x1024", "portrait": "768x1024"}}},
    }
    provider_upsert(tenant=tenant, slug="renders", intent_schema={"fields": fields}, request_template=narrower)

    run_due()

    op = Operation.objects.get()
    assert op.status == S.FAILED and op.error_class == ErrorClass.INVALID_INPUT
    assert op.adapter_revision.number == 2
    assert "intent not valid under adapter revision 2 (intent_value_not_allowed)" in op.last_error
    (attempt,) = Attempt.objects.filter(operation=op)
    assert attempt.adapter_revision.number == 2 and attempt.error_class == ErrorClass.INVALID_INPUT
    assert render_api.received == []


def test_a_dlq_style_resubmission_of_a_stored_intent_is_an_intent(tenant, renders):
    op = operation_submit(tenant=tenant, key="render-9:v1", provider="renders", request={"intent": INTENT}).operation
    assert op.status == S.QUEUED
    with pytest.raises(DomainError) as refused:
        operation_submit(tenant=tenant, key="render-10:v1", provider="renders", request={"intent": {"x": 1}})
    assert refused.value.code == "intent_unknown_field"


# --- The API's save path ----------------------------------------------------------------------------


def test_the_api_sets_the_schema_and_template_as_a_revision_and_refuses_an_expression_with_problem_json(
    tenant, renders, make_client
):
    admin = make_client(tenant, ["admin"])
    writer = make_client(tenant, ["read", "write"])
    url = "/api/v1/providers/renders/intent"
    evil = {**TEMPLATE, "body": {"x": "{{ preset_id.__class__.__mro__ }}"}}

    refused = admin.put(url, {"intent_schema": SCHEMA, "request_template": evil, "reason": "try"}, format="json")
    forbidden = writer.put(url, {"intent_schema": SCHEMA, "request_template": TEMPLATE, "reason": "x"}, format="json")

    assert refused.status_code == 400 and refused["Content-Type"].startswith("application/problem+json")
    assert refused.json()["code"] == "request_template_invalid"
    assert "is not a placeholder" in refused.json()["detail"]
    assert forbidden.status_code == 403
    assert renders.revisions.count() == 1

    changed = {**TEMPLATE, "path": "/v1/renders"}
    ok = admin.put(url, {"intent_schema": SCHEMA, "request_template": changed, "reason": "flat path"}, format="json")
    assert ok.status_code == 200, ok.json()
    assert ok.json()["revision"] == 2 and ok.json()["request_template"]["path"] == "/v1/renders"
    assert writer.get(url).json()["revision"] == 2
    assert renders.revisions.get(number=2).config["request_template"]["path"] == "/v1/renders"


def test_a_dlq_replay_to_the_provider_sends_the_translation_under_the_original_key(tenant, api, renders, render_api):
    render_api.statuses = [400]  # the provider refuses the first render: failed, in the DLQ
    assert submit(api, INTENT).status_code == 202
    run_due()
    op = Operation.objects.get()
    assert op.status == S.FAILED and op.error_class == ErrorClass.INVALID_INPUT
    entry = FailedEvent.objects.get(operation_id=op.pk)

    replay = failed_event_replay(
        tenant_id=tenant.pk, event_pk=entry.pk, actor="user:alice", note="provider fixed", to_provider=True
    )

    first, again = render_api.received
    assert again["path"] == first["path"] == "/v1/presets/studio/renders"
    assert again["body"] == first["body"] and again["body"]["size"] == "768x1024"
    assert again["headers"]["idempotency-key"] == op.key
    replay.refresh_from_db()
    assert replay.outcome == ReplayOutcome.SUCCEEDED


def test_an_upload_deleted_while_the_job_waits_fails_the_attempt_without_sending(api, tenant, renders, render_api):
    source = upload_of(tenant, image_bytes(7, 7))
    assert submit(api, {**INTENT, "source_key": source.key, "source_sha256": source.sha256}).status_code == 202
    uploads.uploads_delete(tenant_id=tenant.pk, upload_ids=[source.pk])  # an erasure, meanwhile

    run_due()

    op = Operation.objects.get()
    assert op.status == S.FAILED and op.error_class == ErrorClass.INVALID_INPUT
    assert "(upload_reference_invalid)" in op.last_error
    assert "intent.source_key names is no longer stored: it was deleted after the job was accepted" in op.last_error
    assert render_api.received == []


# As in production, outside any transaction: inside one, a broken connection breaks it and the
# worker re-raises instead (ledger.execution.attempts).
@pytest.mark.django_db(transaction=True)
def test_a_database_error_while_reading_the_intents_uploads_is_a_not_sent_retry_not_a_possible_send(
    api, tenant, renders, render_api, monkeypatch
):
    assert submit(api, INTENT).status_code == 202
    real = translation.uploads_checked
    calls: list[int] = []

    def dropped(**kwargs: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(translation, "uploads_checked", dropped)
    run_due()

    op = Operation.objects.get()
    # Not sent, so not uncertain: a plain retry, which then goes out once.
    assert op.status == S.RETRY_WAIT
    (attempt,) = Attempt.objects.filter(operation=op)
    assert attempt.outcome == "transient" and "not sent" in attempt.message
    assert render_api.received == []
    make_due(op.pk)
    run_due()
    op.refresh_from_db()
    assert op.status == S.SUCCEEDED and len(render_api.received) == 1


@pytest.mark.parametrize(
    "where",
    [
        {"body": {"prompt": "{{ description }}"}},
        {"body": {"prompt": "Draw this: {{ description }}"}},
        {"path": "/v1/renders/{{ description }}"},
        {"query": {"q": "{{ description }}"}},
        {"headers": {"X-Note": "{{ description }}"}},
    ],
)
def test_a_free_text_field_placed_in_the_request_itself_is_refused_on_save(make_client, tenant, renders, where):
    # User text reaches a provider only through a prompt template's slot, fenced (issue 15 item 2).
    template = {"method": "POST", "path": "/v1/renders", **where}
    with pytest.raises(RequestTemplateInvalid) as refused:
        provider_upsert(tenant=tenant, slug="renders", request_template=template)
    assert "free-text field 'description'" in refused.value.detail

    answer = make_client(tenant, ["admin"]).put(
        "/api/v1/providers/renders/intent",
        {"intent_schema": SCHEMA, "request_template": template, "reason": "raw text"},
        format="json",
    )
    assert answer.status_code == 400 and answer["Content-Type"].startswith("application/problem+json")
    assert answer.json()["code"] == "request_template_invalid"
    renders.refresh_from_db()
    assert renders.request_template == TEMPLATE and renders.revisions.count() == 1
