"""The console's pages for attempts and events (review.console.history_pages): what their ModelAdmins
gave — the list with its filters, search and links, the read-only detail page, the masked
response with its logged reveal, the logged CSV export, the operation page's sections — under
the same permissions, now that both are keyed (id, <time>) and the admin cannot register them."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import User

from ledger.models import Attempt, AttemptOutcome, Operation, OperationEvent
from ledger.platform import crypto
from review.console.history_pages import AttemptPage
from review.models import AccessAction, AccessLog
from tests.console.support import client_for, enforced_provider, failed_op, page, staff, succeeded_op

pytestmark = pytest.mark.django_db

SECRET_ANSWER = {"contact": {"email": "priya.raman@example.invalid"}}


@pytest.fixture
def rows(tenant, other_tenant):
    crm = enforced_provider(tenant)
    done = succeeded_op(tenant, crm, "order-1:charge:v1")
    failed = failed_op(tenant, crm, "order-2:charge:v1")
    theirs = succeeded_op(other_tenant, enforced_provider(other_tenant), "their-1:charge:v1")
    attempt = Attempt.objects.get(operation=done)
    Attempt.objects.filter(pk=attempt.pk).update(response_body=crypto.seal_json(SECRET_ANSWER))
    return {"done": done, "failed": failed, "theirs": theirs, "attempt": attempt}


def _ids_on(body: str, name: str, objs) -> set[int]:
    return {o.id for o in objs if f"/admin/ledger/{name}/{o.id}/change/" in body}


def test_the_attempt_list_filters_searches_and_links_each_row_to_its_page(tenant, rows):
    client = client_for(staff("olga", role="operator", tenants=[tenant]))
    every = list(Attempt.objects.all())

    _, body = page(client, "/admin/ledger/attempt/")
    assert _ids_on(body, "attempt", every) == {rows["attempt"].id, Attempt.objects.get(operation=rows["failed"]).id}
    assert "By outcome" in body and "By error class" in body and "2 attempts" in body

    _, body = page(client, "/admin/ledger/attempt/", data={"outcome__exact": AttemptOutcome.SUCCEEDED})
    assert _ids_on(body, "attempt", every) == {rows["attempt"].id}
    _, body = page(client, "/admin/ledger/attempt/", data={"error_class": "invalid_input"})
    assert _ids_on(body, "attempt", every) == {Attempt.objects.get(operation=rows["failed"]).id}
    # The admin's search: a whole key, provider ref or execution id, any case.
    _, body = page(client, "/admin/ledger/attempt/", data={"q": "ORDER-1:CHARGE:V1"})
    assert _ids_on(body, "attempt", every) == {rows["attempt"].id}
    _, body = page(client, "/admin/ledger/attempt/", data={"q": "ref-order-1:charge:v1"})
    assert _ids_on(body, "attempt", every) == {rows["attempt"].id}
    # Another tenant's key finds nothing.
    _, body = page(client, "/admin/ledger/attempt/", data={"q": "their-1:charge:v1"})
    assert _ids_on(body, "attempt", every) == set()


def test_the_event_list_filters_by_state_and_searches_by_key_or_actor(tenant, rows):
    client = client_for(staff("rita", role="reviewer", tenants=[tenant]))
    every = list(OperationEvent.objects.all())
    mine = {e.id for e in every if e.operation_id in (rows["done"].pk, rows["failed"].pk)}

    _, body = page(client, "/admin/ledger/operationevent/")
    assert _ids_on(body, "operationevent", every) == mine
    _, body = page(client, "/admin/ledger/operationevent/", data={"to_status": "failed"})
    assert _ids_on(body, "operationevent", every) == {
        e.id for e in every if e.operation_id == rows["failed"].pk and e.to_status == "failed"
    }
    _, body = page(client, "/admin/ledger/operationevent/", data={"q": "order-2:charge:v1"})
    assert _ids_on(body, "operationevent", every) == {e.id for e in every if e.operation_id == rows["failed"].pk}


def test_pages_go_newest_first_and_link_older_and_newer_pages(tenant, rows, monkeypatch):
    monkeypatch.setattr(AttemptPage, "list_per_page", 1)
    client = client_for(staff("olga", role="operator", tenants=[tenant]))
    newest, older = sorted(Attempt.objects.filter(operation__tenant=tenant), key=lambda a: -a.id)

    response = client.get("/admin/ledger/attempt/")
    body = response.content.decode()
    assert _ids_on(body, "attempt", [newest, older]) == {newest.id} and 'rel="next"' in body

    body = client.get("/admin/ledger/attempt/", {"p": "2"}).content.decode()
    assert _ids_on(body, "attempt", [newest, older]) == {older.id} and 'rel="prev"' in body


def test_an_attempt_page_shows_its_fields_but_neither_the_token_nor_the_response(tenant, rows):
    attempt = rows["attempt"]
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))

    status, body = page(auditor, f"/admin/ledger/attempt/{attempt.id}/change/")

    assert status == 200
    assert "ref-order-1:charge:v1" in body and "<td>succeeded</td>" in body
    assert f"/admin/ledger/operation/{rows['done'].pk}/change/" in body
    assert attempt.lease_token not in body and rows["done"].lease_token not in body
    assert "priya.raman" not in body and 'data-testid="payload-panel"' in body
    # Auditors see who looked, not the data (view_payload is the admin role's).
    assert 'data-testid="no-reveal"' in body


def test_revealing_an_attempts_response_needs_a_reason_and_is_logged_by_its_id(tenant, rows):
    attempt = rows["attempt"]
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    url = f"/admin/ledger/attempt/{attempt.id}/change/"
    assert f"/admin/onceguard/reveal/ledger/attempt/{attempt.id}/" in page(admin, url)[1]

    reveal = f"/admin/onceguard/reveal/ledger/attempt/{attempt.id}/"
    assert page(admin, reveal)[0] == 200
    response = admin.post(reveal, {"fields_wanted": ["response_body"], "reason": "ticket OPS-31: what did the CRM say"})

    assert response.status_code == 200 and "priya.raman@example.invalid" in response.content.decode()
    entry = AccessLog.objects.get(action=AccessAction.REVEAL)
    assert (entry.tenant_id, entry.object_type, entry.object_id) == (tenant.pk, "ledger.attempt", str(attempt.id))
    assert entry.fields == ["response_body"]
    # Another tenant's attempt cannot be revealed, nor is it found.
    theirs = Attempt.objects.get(operation=rows["theirs"])
    assert page(admin, f"/admin/onceguard/reveal/ledger/attempt/{theirs.id}/")[0] == 404
    assert admin.post(reveal, {"fields_wanted": ["response_body"], "reason": "x"}).status_code == 200
    assert AccessLog.objects.filter(action=AccessAction.REVEAL).count() == 1


def test_the_export_is_the_filtered_list_and_logs_one_row_per_tenant(tenant, other_tenant, rows):
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))

    status, text = page(auditor, "/admin/ledger/attempt/export.csv?outcome__exact=succeeded")

    assert status == 200
    lines = list(csv.reader(io.StringIO(text)))
    assert lines[0] == ["Operation", "Number", "Outcome", "Started at", "Finished at", "Error class", "Provider ref"]
    assert [line[0] for line in lines[1:]] == ["order-1:charge:v1"]
    assert rows["attempt"].lease_token not in text and "priya" not in text
    entry = AccessLog.objects.get(action=AccessAction.EXPORT)
    assert (entry.tenant_id, entry.object_type) == (tenant.pk, "ledger.attempt")
    assert "outcome__exact" in entry.object_ref

    status, text = page(auditor, "/admin/ledger/operationevent/export.csv")
    assert status == 200 and "their-1" not in text and "order-2:charge:v1" in text
    # Exports need review.export_data: an operator may look, not export.
    operator = client_for(staff("olga", role="operator", tenants=[tenant]))
    assert page(operator, "/admin/ledger/attempt/export.csv")[0] == 403
    assert 'data-testid="export-csv"' not in page(operator, "/admin/ledger/attempt/")[1]
    assert 'data-testid="export-csv"' in page(auditor, "/admin/ledger/attempt/")[1]


def test_without_the_view_permission_there_is_no_page_no_section_and_no_index_entry(tenant, rows):
    viewer = client_for(staff("vic", role=None, tenants=[tenant], perms=["ledger.view_operation"]))
    op = rows["done"]

    assert page(viewer, "/admin/ledger/attempt/")[0] == 403
    assert page(viewer, f"/admin/ledger/attempt/{rows['attempt'].id}/change/")[0] == 403
    assert page(viewer, "/admin/ledger/operationevent/")[0] == 403
    _, body = page(viewer, f"/admin/ledger/operation/{op.pk}/change/")
    assert 'data-testid="attempts"' not in body and 'data-testid="events"' not in body
    assert "/admin/ledger/attempt/" not in page(viewer, "/admin/ledger/")[1]

    reader = client_for(
        staff("reed", role=None, tenants=[tenant], perms=["ledger.view_operation", "ledger.view_attempt"])
    )
    _, body = page(reader, f"/admin/ledger/operation/{op.pk}/change/")
    assert 'data-testid="attempts"' in body and 'data-testid="events"' not in body
    assert "/admin/ledger/attempt/" in page(reader, "/admin/ledger/")[1]
    assert "/admin/ledger/attempt/" in page(reader, "/admin/")[1]


def test_the_operation_page_lists_attempts_and_events_each_linking_to_its_page(tenant, rows):
    op = rows["failed"]
    client = client_for(staff("olga", role="operator", tenants=[tenant]))

    _, body = page(client, f"/admin/ledger/operation/{op.pk}/change/")

    attempt = Attempt.objects.get(operation=op)
    assert f"/admin/ledger/attempt/{attempt.id}/change/" in body and "HTTP 422" in body
    events = list(OperationEvent.objects.filter(operation=op).order_by("at", "id"))
    # The claim→failed pair is one event row; its claim is kept on the operation row (ADR 0024).
    assert len(events) >= 1
    assert all(f"/admin/ledger/operationevent/{e.id}/change/" in body for e in events)
    # Plus the claim, kept on the operation row instead of an event row (ADR 0024).
    assert body.count('data-testid="event-row"') == len(events) + 1
    status, event_page = page(client, f"/admin/ledger/operationevent/{events[-1].id}/change/")
    assert status == 200 and "failed" in event_page and f"/admin/ledger/operation/{op.pk}/change/" in event_page


def test_nobody_writes_through_these_pages(tenant, rows):
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    attempt = rows["attempt"]
    before = Attempt.objects.filter(id=attempt.id).values().get()

    for url in (
        "/admin/ledger/attempt/",
        f"/admin/ledger/attempt/{attempt.id}/change/",
        "/admin/ledger/attempt/export.csv",
    ):
        assert root.post(url, {"outcome": "failed", "action": "delete_selected"}).status_code == 405, url

    assert Attempt.objects.filter(id=attempt.id).values().get() == before
    assert Operation.objects.filter(pk=rows["done"].pk).exists()


def test_an_id_that_is_not_a_number_or_not_there_is_not_found(tenant, rows):
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    assert page(root, "/admin/ledger/attempt/999999/change/")[0] == 404
    assert page(root, "/admin/ledger/attempt/(1,%202026)/change/")[0] == 404
    assert page(root, "/admin/onceguard/reveal/ledger/attempt/abc/")[0] == 404


def test_the_history_pages_escape_hostile_text_and_answer_odd_parameters_without_an_error(tenant):
    # Hand-written pages (not the admin's): a key, message, reason or actor holding markup is
    # shown escaped; filters, pages and searches a client made up are answered, never a 500.
    hostile = "<script>alert('x')</script>\"&amp;"
    crm = enforced_provider(tenant)
    op = succeeded_op(tenant, crm, hostile)
    OperationEvent.objects.filter(operation=op).update(reason=hostile, actor=hostile)
    Attempt.objects.filter(operation=op).update(message=hostile, provider_ref=hostile, execution_id=hostile)
    client = client_for(User.objects.create_superuser("root", "root@example.invalid", "x"))
    attempt = Attempt.objects.filter(operation=op).first()
    event = OperationEvent.objects.filter(operation=op).first()
    details = [f"/admin/ledger/attempt/{attempt.id}/change/", f"/admin/ledger/operationevent/{event.id}/change/"]
    lists = [
        base + query
        for base in ("/admin/ledger/attempt/", "/admin/ledger/operationevent/")
        for query in ("", "?q=%3Cscript", "?q=%22", "?q='", "?p=abc", "?p=0", "?p=99999", "?outcome__exact=%3Cx")
        + ("?to_status=%3Cx", "?error_class=x%22&q=%3Cscript%3E", "?q=\\", "?q=" + "a" * 3000)
    ]
    # A filter the page does not offer (an attempt's outcome on the events page) is a 400 page.
    offered = {
        "/admin/ledger/attempt/": ("outcome__exact", "error_class"),
        "/admin/ledger/operationevent/": ("to_status",),
    }
    for url in details + lists:
        response = client.get(url)
        base, _, query = url.partition("?")
        names = {pair.partition("=")[0] for pair in query.split("&") if pair} - {"q", "p"}
        expected = 400 if names - set(offered.get(base, names)) else 200
        assert response.status_code == expected, (url, response.status_code)
        body = response.content.decode()
        assert "<script>alert" not in body, url
    for url in details:
        assert "&lt;script&gt;alert(&#x27;x&#x27;)" in client.get(url).content.decode(), url
