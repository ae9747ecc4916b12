"""Evaluation manifests (ADR 0022) against real loopback providers: a generating job carries a
manifest written with its submission or before its output exists — never after, never changed
— checked against its preset's schema, stored by digest and sealed; an extraction job that
names it is scored field by field when its answer comes in, and the score is on the API and
the console. Erasure and retention take the manifest with its job."""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from ledger.execution import manifests
from ledger.models import (
    ManifestScore,
    ManifestScoreStatus,
    Operation,
    OperationEvent,
    OperationManifest,
    OperationOutput,
    OperationStatus,
    OutputVerdict,
    PromptTemplate,
    Tenant,
)
from ledger.platform import crypto
from ledger.protocol import services
from ledger.providers import prompts
from ledger.rules.manifests import ManifestSchemaInvalid, manifest_compare
from review.privacy import erasure
from review.privacy.subjects import subject_resolve
from review.retention.purge import retention_purge_tenant
from tests.execute.conftest import configure_provider
from tests.execute.support import RenderApi, run_due, wait_until
from tests.support.loopback import LoopbackServer, QuietHandler

S = OperationStatus

MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["vendor_name", "invoice_id", "currency", "total", "line_items"],
    "properties": {
        "vendor_name": {"type": "string"},
        "invoice_id": {"type": "string"},
        "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "total": {"type": "number"},
        "line_items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "amount"],
                "properties": {
                    "id": {"type": "string"},
                    "description": {"type": "string"},
                    "amount": {"type": "number"},
                },
            },
        },
    },
}
MANIFEST = {
    "vendor_name": "Acme Office Supplies Ltd.",
    "invoice_id": "INV-2026-0042",
    "currency": "EUR",
    "total": 1234.5,
    "line_items": [
        {"id": "L1", "description": "Paper, A4", "amount": 1000.0},
        {"id": "L2", "description": "Toner", "amount": 234.5},
    ],
}
INTENT_SCHEMA = {"fields": {"style": {"type": "enum", "values": ["plain", "busy"], "required": True}}}
TEMPLATE = {"method": "POST", "path": "/v1/renders", "body": {"prompt": "{{ prompt:invoice }}"}}


class ExtractApi:
    """A loopback extraction provider: answers each request with the next scripted fields."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[dict[str, Any]] = []
        api = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with api.lock:
                    fields = api.answers.pop(0)
                self.answer(200, json.dumps({"id": "ex_1", "status": "succeeded", "fields": fields}).encode())

        self.server = LoopbackServer(Handler).start()
        self.url = self.server.url


@pytest.fixture
def preset(tenant: Tenant) -> PromptTemplate:
    return prompts.prompt_template_create(
        tenant=tenant,
        name="invoice",
        text="Draw a test invoice in the {{ style }} layout.",
        slots={"style": {"max_length": 10}},
        actor="user:alice",
        manifest_schema=MANIFEST_SCHEMA,
    )


@pytest.fixture
def docs(tenant: Tenant, render_api: RenderApi, preset: PromptTemplate):
    return configure_provider(
        tenant,
        render_api.url,
        slug="docs",
        enforced=True,
        lookup_path="",
        intent_schema=INTENT_SCHEMA,
        request_template=TEMPLATE,
    )


@pytest.fixture
def extract_api():
    api = ExtractApi()
    yield api
    api.server.stop()


@pytest.fixture
def extractor(tenant: Tenant, extract_api: ExtractApi):
    return configure_provider(tenant, extract_api.url, slug="extract", enforced=True, lookup_path="")


def generate(client, *, key: str = "doc-1", manifest: Any = None):
    body: dict[str, Any] = {"key": key, "provider": "docs", "intent": {"style": "plain"}}
    if manifest is not None:
        body["manifest"] = manifest
    return client.post("/api/v1/operations", body, format="json")


def extract(client, *, evaluates: Any, key: str = "extract-1"):
    request = {"method": "POST", "path": "/v1/extract", "body": {"document": "out_…"}}
    body = {"key": key, "provider": "extract", "request": request, "evaluates": evaluates}
    return client.post("/api/v1/operations", body, format="json")


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_a_manifest_sent_with_the_submission_is_stored_sealed_by_the_digest_of_its_canonical_json(api, docs):
    response = generate(api, manifest=MANIFEST)
    assert response.status_code == 202, response.json()
    op_id = response.json()["id"]

    shown = api.get(f"/api/v1/operations/{op_id}/manifest").json()
    assert shown["sha256"] == digest(MANIFEST) and shown["content"] == MANIFEST
    assert shown["preset"] == "invoice@1" and shown["output"] is None
    stored = OperationManifest.objects.get(operation_id=op_id)
    assert crypto.is_sealed(stored.content) == crypto.encryption_enabled()
    assert OperationEvent.objects.filter(operation_id=op_id, reason__startswith="evaluation manifest stored").exists()


def test_a_manifest_put_before_the_output_is_stored_once_the_same_again_is_200_and_another_is_409(api, docs):
    op_id = generate(api).json()["id"]
    url = f"/api/v1/operations/{op_id}/manifest"

    first = api.put(url, {"manifest": MANIFEST}, format="json")
    again = api.put(url, {"manifest": json.loads(json.dumps(MANIFEST))}, format="json")
    other = api.put(url, {"manifest": {**MANIFEST, "total": 99.0}}, format="json")

    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.json()["sha256"] == first.json()["sha256"]
    assert other.status_code == 409 and other.json()["code"] == "manifest_conflict"
    assert OperationManifest.objects.get(operation_id=op_id).sha256 == digest(MANIFEST)


def test_a_manifest_that_does_not_match_its_presets_schema_is_a_422_and_nothing_is_accepted(api, docs):
    wrong = {**MANIFEST, "currency": "euro"}
    del wrong["invoice_id"]

    refused = generate(api, manifest=wrong)

    assert refused.status_code == 422
    problem = refused.json()
    assert problem["code"] == "manifest_invalid" and problem["preset"] == "invoice@1"
    assert {p["path"] for p in problem["problems"]} == {"/", "/currency"}
    # The refusal names where and which rule, never the value.
    assert "euro" not in json.dumps(problem)
    assert not Operation.objects.exists()
    op_id = generate(api).json()["id"]
    put = api.put(f"/api/v1/operations/{op_id}/manifest", {"manifest": ["not", "an", "object"]}, format="json")
    assert put.status_code == 422 and put.json()["code"] == "manifest_invalid"


def test_a_manifest_after_the_output_exists_is_a_409_and_a_published_output_is_linked(api, tenant, docs):
    finished = generate(api, key="doc-done").json()["id"]
    run_due()
    assert Operation.objects.get(pk=finished).status == S.SUCCEEDED
    late = api.put(f"/api/v1/operations/{finished}/manifest", {"manifest": MANIFEST}, format="json")
    assert late.status_code == 409 and late.json()["code"] == "manifest_after_output"
    assert not OperationManifest.objects.filter(operation_id=finished).exists()

    # An output published while the job is still open: the manifest before it is linked to it,
    # and none can be written after it.
    with_manifest = generate(api, key="doc-linked", manifest=MANIFEST).json()["id"]
    without = generate(api, key="doc-bare").json()["id"]
    for op_id in (with_manifest, without):
        output = OperationOutput.objects.create(
            tenant=tenant,
            operation_id=op_id,
            key=f"out_{op_id:064x}",
            sha256=f"{op_id:064x}",
            size=1,
            media_type="application/pdf",
            storage_name="outputs/x",
        )
        manifests.manifest_output_link(tenant_id=tenant.pk, operation_id=op_id, output_id=output.pk)
    assert api.get(f"/api/v1/operations/{with_manifest}/manifest").json()["output"] == f"out_{with_manifest:064x}"
    late = api.put(f"/api/v1/operations/{without}/manifest", {"manifest": MANIFEST}, format="json")
    assert late.status_code == 409 and late.json()["code"] == "manifest_after_output"


def test_an_extraction_is_scored_against_its_documents_manifest_when_its_answer_comes_in(
    api, docs, extractor, extract_api, admin_client
):
    doc = generate(api, manifest=MANIFEST).json()["id"]
    exact = {**MANIFEST, "vendor_name": "ACME office supplies ltd", "currency": "eur"}
    # Total within a cent; a line item's amount off; the invoice id missing; an item invented.
    partial = {
        "vendor_name": "Acme Office Supplies Ltd.",
        "currency": "EUR",
        "total": "1,234.504",
        "line_items": [
            {"id": "L2", "description": "toner", "amount": 234.5},
            {"id": "L1", "description": "Paper A4", "amount": 100.0},
            {"id": "L9", "description": "Stapler", "amount": 5.0},
        ],
    }
    extract_api.answers = [exact, partial]
    first = extract(api, evaluates={"operation": doc, "pointer": "/fields"}, key="extract-1").json()["id"]
    second = extract(api, evaluates={"operation": doc, "pointer": "/fields"}, key="extract-2").json()["id"]
    assert ManifestScore.objects.get(operation_id=first).status == ManifestScoreStatus.PENDING

    run_due()

    full = api.get(f"/api/v1/operations/{first}/manifest-score").json()
    assert full["status"] == "scored" and full["score"] == 1.0 and full["manifest_sha256"] == digest(MANIFEST)
    some = api.get(f"/api/v1/operations/{second}/manifest-score").json()
    results = {d["field"]: (d["match"], d["result"]) for d in some["details"]}
    assert results["invoice_id"] == ("exact", "missing")
    assert results["total"] == ("numeric", "match")
    assert results["vendor_name"] == ("normalized", "match")
    assert results["line_items[0].amount"] == ("numeric", "mismatch")
    assert results["line_items[1].amount"] == ("numeric", "match")
    assert results["line_items[+2]"] == ("item", "unexpected")
    # 11 compared (4 fields, 6 of the line items', 1 invented item), 8 matched.
    matched = sum(1 for d in some["details"] if d["result"] == "match")
    assert (matched, len(some["details"])) == (8, 11) and some["score"] == pytest.approx(8 / 11)
    # No value of the document in the details.
    assert "Acme" not in json.dumps(some["details"]) and "1234" not in json.dumps(some["details"])
    # Each score is the extraction's verdict for the canary's quality gate (ADR 0020).
    verdicts = {v.operation_id: v for v in OutputVerdict.objects.filter(source="manifest")}
    assert set(verdicts) == {first, second}
    assert verdicts[second].score == pytest.approx(8 / 11) and verdicts[second].actor == "manifests"
    # On the console's operation page.
    page = admin_client.get(f"/admin/ledger/operation/{second}/change/").content.decode()
    assert "manifest score" in page.lower() and f"{some['score']:.3f}" in page


def test_an_extraction_must_name_a_generating_job_of_its_tenant_with_a_manifest(
    api, tenant, other_tenant, make_client, docs, extractor
):
    bare = generate(api, key="doc-bare").json()["id"]
    assert extract(api, evaluates={"operation": bare}).json()["code"] == "evaluates_invalid"
    assert extract(api, evaluates={"operation": bare, "pointer": "fields"}).status_code == 422
    doc = generate(api, key="doc-1", manifest=MANIFEST).json()["id"]
    theirs = make_client(other_tenant)
    # Another tenant's job, manifest and score: as if they did not exist.
    configure_provider(other_tenant, "http://127.0.0.1:9", slug="extract", enforced=True, lookup_path="")
    assert extract(theirs, evaluates={"operation": doc}).status_code == 404
    assert theirs.get(f"/api/v1/operations/{doc}/manifest").status_code == 404
    assert theirs.put(f"/api/v1/operations/{doc}/manifest", {"manifest": MANIFEST}, format="json").status_code == 404
    mine = extract(api, evaluates=doc).json()["id"]
    assert theirs.get(f"/api/v1/operations/{mine}/manifest-score").status_code == 404
    # A read-only key of the tenant sees the manifest's facts, not its content.
    reader = make_client(tenant, scopes=["read"]).get(f"/api/v1/operations/{doc}/manifest").json()
    assert reader["sha256"] == digest(MANIFEST) and "content" not in reader


def test_an_erasure_deletes_its_jobs_manifest_and_retention_deletes_it_with_the_job(
    api, tenant, docs, extractor, extract_api
):
    email = "mei.lin@example.invalid"
    crm = configure_provider(tenant, "http://127.0.0.1:9", slug="crm", enforced=True)
    hers = services.operation_claim(tenant=tenant, key="lead-1", provider=crm, payload={"email": email}).operation
    manifests.manifest_store(
        operation_id=hers.pk,
        tenant_id=tenant.pk,
        checked=manifests.manifest_check(manifest={"vendor_name": "Mei Lin"}, presets=[]),
        actor="test",
    )
    OutputVerdict.objects.create(
        tenant=tenant,
        operation=hers,
        source="consumer",
        actor="apikey:test",
        verdict="rejected",
        reason=f"names {email} instead of the vendor",
        created_at=timezone.now(),
    )
    run, _ = erasure.erasure_request(
        tenant_id=tenant.pk,
        subject=subject_resolve({"email": email}),
        actor="user:ada",
        reason="Erasure request ER-1, verified",
        enqueue=False,
    )
    erasure.erasure_continue(run_id=run.pk)
    assert not OperationManifest.objects.filter(operation_id=hers.pk).exists()
    # A consumer's verdict on her output quoted her (ADR 0020): its reason is cut, its verdict stays.
    said = OutputVerdict.objects.get(operation_id=hers.pk)
    assert said.reason == "names [erased] instead of the vendor" and said.verdict == "rejected"

    doc = generate(api, manifest=MANIFEST).json()["id"]
    extract_api.answers = [MANIFEST]
    reader = extract(api, evaluates={"operation": doc, "pointer": "/fields"}).json()["id"]
    run_due()
    past = timezone.now() - timedelta(days=400)
    Operation.objects.filter(pk=doc).update(updated_at=past, done_at=past)
    retention_purge_tenant(tenant_id=tenant.pk)
    assert not Operation.objects.filter(pk=doc).exists() and not OperationManifest.objects.exists()
    # The extraction's score stays with it (no value of the document in it); its link is cleared.
    kept = ManifestScore.objects.get(operation_id=reader)
    assert kept.status == ManifestScoreStatus.SCORED and kept.evaluates_id is None
    # The extraction itself goes with its score and its verdict (ADR 0020): the verdict names the
    # operation only, by a hidden relation the purge must not miss.
    assert OutputVerdict.objects.filter(operation_id=reader).exists()
    Operation.objects.filter(pk=reader).update(updated_at=past, done_at=past)
    retention_purge_tenant(tenant_id=tenant.pk)
    assert not Operation.objects.filter(pk=reader).exists()
    assert not OutputVerdict.objects.filter(operation_id=reader).exists()


@pytest.mark.parametrize(
    ("extracted", "expected_results"),
    [
        # Exact: ids and codes compared as written (currency case aside).
        ({"invoice_id": "inv-2026-0042", "currency": "eur"}, {"invoice_id": "mismatch", "currency": "match"}),
        # Normalized: names compared without case, punctuation or spacing.
        ({"vendor_name": "  acme OFFICE supplies, ltd"}, {"vendor_name": "match"}),
        # Numeric: within the tolerance (a cent), numbers written as text too.
        (
            {"total": 1234.509, "line_items": [{"amount": "€1,000.00"}, {"amount": 234.6}]},
            {"total": "match", "line_items[0].amount": "match", "line_items[1].amount": "mismatch"},
        ),
        # Missing fields count against the score.
        ({}, {"vendor_name": "missing", "total": "missing", "line_items[1].amount": "missing"}),
    ],
)
def test_fields_are_compared_exactly_normalized_or_within_a_tolerance_and_missing_ones_count(
    extracted, expected_results
):
    expected = {
        "vendor_name": MANIFEST["vendor_name"],
        "invoice_id": MANIFEST["invoice_id"],
        "currency": "EUR",
        "total": 1234.5,
        "line_items": [{"amount": 1000.0}, {"amount": 234.5}],
    }
    score, details = manifest_compare(expected, extracted)
    results = {d["field"]: d["result"] for d in details}
    for field, result in expected_results.items():
        assert results[field] == result
    assert score == pytest.approx(sum(r == "match" for r in results.values()) / len(results), abs=1e-6)


def test_a_schema_can_say_how_a_field_is_compared_and_which_key_matches_line_items():
    schema = {
        "properties": {
            "total": {"x-tolerance": 1},
            "ref": {"x-match": "normalized"},
            "items": {"items": {"x-key": "sku"}},
        }
    }
    expected = {"total": 10, "ref": "AB-1", "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}
    score, details = manifest_compare(
        expected,
        {"total": 10.9, "ref": "ab 1", "items": [{"sku": "b", "qty": 2}, {"sku": "a", "qty": 1}]},
        schema=schema,
    )
    assert score == 1.0 and len(details) == 6


def test_a_preset_manifest_schema_that_is_not_a_json_schema_is_refused(tenant):
    with pytest.raises(ManifestSchemaInvalid):
        prompts.prompt_template_create(
            tenant=tenant,
            name="bad",
            text="x {{ s }}",
            slots={"s": {"max_length": 5}},
            actor="a",
            manifest_schema={"type": "nonsense"},
        )


# --- The race with the output's publish, on PostgreSQL --------------------------------------------


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views answer from a snapshot: take a fresh one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_manifest_racing_the_outputs_publish_waits_for_its_lock_and_is_refused_after_it(tenant, api, docs):
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    op_id = generate(api).json()["id"]
    results: list[Any] = []

    def put() -> None:
        try:
            results.append(manifests.manifest_put(tenant=tenant, operation_id=op_id, manifest=MANIFEST, actor="t"))
        except BaseException as exc:
            results.append(exc)
        finally:
            connection.close()

    with transaction.atomic():
        # The publish holds the operation's row while it records the output (ledger.execution.outputs).
        Operation.objects.select_for_update().get(pk=op_id)
        thread = threading.Thread(target=put, daemon=True)
        thread.start()
        assert wait_until(_blocked_on_a_lock, timeout=20), "the manifest never waited for the publish's lock"
        OperationOutput.objects.create(
            tenant=tenant,
            operation_id=op_id,
            key="out_" + "a" * 64,
            sha256="a" * 64,
            size=1,
            media_type="application/pdf",
            storage_name="outputs/x",
        )
    thread.join(timeout=30)

    assert not thread.is_alive()
    (outcome,) = results
    assert isinstance(outcome, manifests.ManifestAfterOutput)
    assert not OperationManifest.objects.filter(operation_id=op_id).exists()


def test_the_command_creates_a_preset_version_with_its_manifest_schema(tenant, tmp_path):
    (tmp_path / "prompt.txt").write_text("Draw a receipt in the {{ style }} layout.")
    (tmp_path / "schema.json").write_text(json.dumps(MANIFEST_SCHEMA))
    call_command(
        "prompt_template",
        "create",
        "--tenant",
        tenant.slug,
        "--name",
        "receipt",
        "--slot",
        "style=10",
        "--text-file",
        str(tmp_path / "prompt.txt"),
        "--manifest-schema-file",
        str(tmp_path / "schema.json"),
        stdout=StringIO(),
    )
    assert PromptTemplate.objects.get(tenant=tenant, name="receipt").manifest_schema == MANIFEST_SCHEMA
    (tmp_path / "schema.json").write_text('{"type": 7}')
    with pytest.raises(CommandError, match="not a JSON Schema"):
        call_command(
            "prompt_template",
            "create",
            "--tenant",
            tenant.slug,
            "--name",
            "receipt",
            "--slot",
            "style=10",
            "--text-file",
            str(tmp_path / "prompt.txt"),
            "--manifest-schema-file",
            str(tmp_path / "schema.json"),
        )
