"""A guard pair's two moves, one event row (ADR 0024): the claim is kept on the operation row and
every history lists it as before — the operation's console page, the review item's events, the
subject trail, the events export — for a finished pair and for an operation still claimed."""

from __future__ import annotations

import csv
import io

import pytest

from ledger.models import Operation, OperationEvent, OperationMode, OperationStatus
from ledger.protocol import services
from ledger.protocol.selectors import operation_history
from review.decisions.serializers import review_item_representation
from tests.console.support import client_for, enforced_provider, page, staff

pytestmark = pytest.mark.django_db
S = OperationStatus


def _moves(op: Operation) -> list[tuple[str, str, str, str, int | None]]:
    stored = OperationEvent.objects.filter(operation_id=op.pk, tenant_id=op.tenant_id)
    return [(e.from_status, e.to_status, e.actor, e.reason, e.attempt) for e in operation_history(op, stored)]


def test_a_guard_pair_writes_one_event_row_and_its_history_lists_both_moves(tenant):
    crm = enforced_provider(tenant)
    claimed = services.operation_claim(tenant=tenant, key="pair-1", provider=crm, actor="apikey:ab12").operation
    done = services.operation_complete(
        operation_id=claimed.pk, tenant_id=claimed.tenant_id, lease_token=claimed.lease_token, actor="apikey:ab12"
    )

    assert OperationEvent.objects.filter(operation_id=done.pk).count() == 1
    assert _moves(done) == [
        ("", S.CLAIMED, "apikey:ab12", "claimed", 1),
        (S.CLAIMED, S.SUCCEEDED, "apikey:ab12", "completed", 1),
    ]
    history = operation_history(done, OperationEvent.objects.filter(operation_id=done.pk))
    # The claim's time is the row's creation, the claim statement's clock (as its event's was).
    assert history[0].at == done.created_at and history[0].at <= history[1].at

    client = client_for(staff("olga", role="operator", tenants=[tenant]))
    _, body = page(client, f"/admin/ledger/operation/{done.pk}/change/")
    assert body.count('data-testid="event-row"') == 2
    assert "apikey:ab12" in body and ">claimed<" in body.replace("</td>", "<")

    moves = [(m["from"], m["to"], m["actor"]) for m in review_item_representation(done)["events"]]
    assert moves == [("", S.CLAIMED, "apikey:ab12"), (S.CLAIMED, S.SUCCEEDED, "apikey:ab12")]


def test_an_operation_still_claimed_shows_its_claim_from_the_row(tenant):
    crm = enforced_provider(tenant)
    op = services.operation_claim(
        tenant=tenant, key="open-1", provider=crm, actor="apikey:cd34", mark_sent=True
    ).operation

    assert not OperationEvent.objects.filter(operation_id=op.pk).exists()
    assert _moves(Operation.objects.get(pk=op.pk)) == [("", S.CLAIMED, "apikey:cd34", "claimed, sent", 1)]
    client = client_for(staff("olga", role="operator", tenants=[tenant]))
    _, body = page(client, f"/admin/ledger/operation/{op.pk}/change/")
    assert body.count('data-testid="event-row"') == 1 and "claimed, sent" in body


def test_an_execute_mode_claim_keeps_its_event_row(tenant):
    crm = enforced_provider(tenant)
    op = services.operation_claim(
        tenant=tenant, key="exec-1", provider=crm, mode=OperationMode.EXECUTE, request={"a": 1}, actor="apikey:ef56"
    ).operation

    assert op.claim_actor is None
    assert list(OperationEvent.objects.filter(operation_id=op.pk).values_list("from_status", "to_status")) == [
        ("", S.QUEUED)
    ]
    assert _moves(op) == [("", S.QUEUED, "apikey:ef56", "queued", 0)]


def test_the_events_export_lists_the_claims_kept_on_rows_among_the_event_rows(tenant, other_tenant):
    crm = enforced_provider(tenant)
    first = services.operation_claim(tenant=tenant, key="exp-1", provider=crm, actor="apikey:one").operation
    services.operation_complete(operation_id=first.pk, tenant_id=first.tenant_id, lease_token=first.lease_token)
    services.operation_claim(tenant=tenant, key="exp-2", provider=crm, actor="apikey:two")
    services.operation_claim(tenant=other_tenant, key="their-1", provider=enforced_provider(other_tenant))
    auditor = client_for(staff("aud", role="auditor", tenants=[tenant]))

    _, text = page(auditor, "/admin/ledger/operationevent/export.csv")
    lines = list(csv.reader(io.StringIO(text)))[1:]
    # Every move of the tenant's operations, nothing of the other tenant's, newest first.
    assert sorted((line[0], line[1], line[2], line[3]) for line in lines) == [
        ("exp-1", "", S.CLAIMED, "apikey:one"),
        ("exp-1", S.CLAIMED, S.SUCCEEDED, "api"),
        ("exp-2", "", S.CLAIMED, "apikey:two"),
    ]
    times = [line[5] for line in lines]
    assert times == sorted(times, reverse=True)
    _, text = page(auditor, "/admin/ledger/operationevent/export.csv", data={"to_status": S.SUCCEEDED})
    assert [line[2] for line in list(csv.reader(io.StringIO(text)))[1:]] == [S.SUCCEEDED]
    _, text = page(auditor, "/admin/ledger/operationevent/export.csv", data={"q": "apikey:two"})
    assert [line[0] for line in list(csv.reader(io.StringIO(text)))[1:]] == ["exp-2"]
