"""A dead-letter entry with no usable key says so in words, and the console sets its key before
it offers the replay: checked by the key rule, written to the entry's trail, then replayed under
that key to a real receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

from dlq.entries import services as dlq_entries
from dlq.models import FailedEvent, FailedEventChange, KeySource
from dlq.rules.errors import KeyNotSettable
from dlq.targets import services as dlq_targets
from ledger.platform.errors import InvalidKey
from tests.console.support import client_for
from tests.dlq.sinks import Sink
from tests.dlq.test_n8n_occurrences import error_report, ingest

pytestmark = pytest.mark.django_db

KEY = "lead:call_7f3c2a9e41b04d6f:crm-contact:v1"


@pytest.fixture
def sink() -> Iterator[Sink]:
    started = Sink().start()
    yield started
    started.stop()


@pytest.fixture
def entry(tenant, sink) -> FailedEvent:
    dlq_targets.replay_target_upsert(
        tenant=tenant, slug="crm", url=f"{sink.url}/contacts", timeout_seconds=2.0, is_default=True
    )
    event = ingest(tenant, error_report("4812", key=None)).event
    assert event.key_source == KeySource.MISSING
    return event


@pytest.fixture
def console(db):
    return client_for(User.objects.create_superuser("root", password="correct horse battery"))


def test_the_entry_says_it_has_no_usable_key_and_offers_to_set_one_instead_of_a_replay(entry, console):
    page = console.get(f"/admin/dlq/failedevent/{entry.pk}/change/").content.decode()
    assert 'data-testid="no-usable-key"' in page and "No business key" in page
    assert f'href="/admin/dlq/failedevent/{entry.pk}/set-key/" data-testid="set-key"' in page
    assert 'data-testid="replay"' not in page
    # The replay page itself sends the person to the key first.
    answer = console.get(f"/admin/dlq/failedevent/{entry.pk}/replay/")
    assert answer.status_code == 302 and answer["Location"].endswith(f"/{entry.pk}/set-key/")


def test_a_key_set_in_the_console_is_audited_and_the_replay_goes_out_under_it(entry, console, sink):
    answer = console.post(f"/admin/dlq/failedevent/{entry.pk}/set-key/", {"key": KEY, "note": "CRM record id"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    entry.refresh_from_db()
    assert (entry.original_key, entry.key_source) == (KEY, KeySource.SET_BY_PERSON)
    change = FailedEventChange.objects.filter(event=entry).order_by("-id").first()
    assert change.actor.endswith("root") and f"key set to {KEY}" in change.note and "CRM record id" in change.note
    page = console.get(f"/admin/dlq/failedevent/{entry.pk}/change/").content.decode()
    assert 'data-testid="replay"' in page and 'data-testid="no-usable-key"' not in page

    replayed = console.post(f"/admin/dlq/failedevent/{entry.pk}/replay/", {"note": "key set", "target": ""})
    assert replayed.status_code == 302
    sent = sink.received()
    assert len(sent) == 1 and sent[0].header("Idempotency-Key") == KEY


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "required"),
        ("x" * 256, "max_length"),
        (" padded ", "no_surrounding_blanks"),
        ("ｃafé", "printable_ascii"),
        ("lead:priya.raman@example.invalid", "personal_data"),
    ],
)
def test_a_key_that_breaks_the_key_rule_is_refused_with_the_rule_in_words(entry, bad, rule):
    with pytest.raises(InvalidKey) as refused:
        dlq_entries.failed_event_key_set(tenant_id=entry.tenant_id, event_pk=entry.pk, key=bad, actor="t")
    assert refused.value.extra["rule"] == rule
    entry.refresh_from_db()
    assert entry.key_source == KeySource.MISSING and not FailedEventChange.objects.filter(note__contains="key set")


def test_the_console_form_shows_the_refusal_and_changes_nothing(entry, console):
    page = console.post(f"/admin/dlq/failedevent/{entry.pk}/set-key/", {"key": "lead:+61412345678"})
    assert page.status_code == 200
    assert "Key not set" in page.content.decode() and "phone number" in page.content.decode()
    entry.refresh_from_db()
    assert entry.key_source == KeySource.MISSING


def test_a_key_is_set_once_and_never_over_a_key_another_open_entry_holds(entry, tenant):
    dlq_entries.failed_event_key_set(tenant_id=tenant.pk, event_pk=entry.pk, key=KEY, actor="t")
    with pytest.raises(KeyNotSettable):
        dlq_entries.failed_event_key_set(tenant_id=tenant.pk, event_pk=entry.pk, key="other:v1", actor="t")
    second = ingest(tenant, error_report("4813", key=None)).event
    with pytest.raises(KeyNotSettable) as held:
        dlq_entries.failed_event_key_set(tenant_id=tenant.pk, event_pk=second.pk, key=KEY, actor="t")
    assert held.value.extra["entry"] == entry.pk
