"""Failures explain themselves and lead somewhere: a replay's transport error is shown as a
sentence with its cause and next step (ledger.web.failures), the raw error scrubbed behind a
disclosure, on the DLQ entry, in the replay's result and on the replay's operation page —
which links back to its entry and on to what can be done next. The demo lead replays to the
demo's own mock CRM (the key-enforced mock `make run` starts at DEMO_PORT_BASE)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from dlq.models import FailedEvent, Replay
from dlq.targets import services as dlq_targets
from ledger.models import Operation
from ledger.web.failures import explain_failure, failure_html
from review.demo import demo_seed
from tests.console.support import client_for
from tests.dlq.conftest import example
from tests.support.fixtures import *  # noqa: F403 - the loopback mock providers
from tests.support.ports import free_port

pytestmark = pytest.mark.django_db

ENVELOPE = {
    "event_id": "lead-91",
    "idempotency_key": "lead-91:crm:create:v1",
    "payload": example("crm-create-contact-request.json"),
    "error": {"message": "CRM answered 429", "class": "transient"},
}


def replay_to(client, tenant, url: str, **target) -> Replay:
    dlq_targets.replay_target_upsert(tenant=tenant, slug="crm", url=url, is_default=True, **target)
    event_id = client.post("/api/v1/dlq/events", ENVELOPE, format="json").json()["id"]
    client.post(f"/api/v1/dlq/events/{event_id}/replay", {}, format="json")
    return Replay.objects.get(event_id=event_id)


def sentence_of(replay: Replay, url: str) -> str:
    return explain_failure(replay.error_message, status=replay.response_status, url=url).sentence


def test_a_closed_loopback_port_says_the_connection_was_refused_and_asks_if_the_receiver_runs(
    client, tenant, outbound_allow
):
    url = f"http://127.0.0.1:{free_port()}/contacts"
    outbound_allow(url)
    replay = replay_to(client, tenant, url)
    assert replay.outcome == "failed"
    port = url.split(":")[2].split("/")[0]
    assert sentence_of(replay, url) == f"connection refused by 127.0.0.1:{port} — is the receiver running?"
    # The stored raw text names the destination itself: the operation page has no target to ask.
    op = Operation.objects.get(pk=replay.operation_id)
    assert explain_failure(op.last_error).sentence.startswith(f"connection refused by 127.0.0.1:{port}")


def test_a_name_that_never_resolves_says_so_and_to_edit_the_target_s_url(client, tenant):
    url = "https://demo-crm.invalid/contacts"  # a target off this machine must be https
    replay = replay_to(client, tenant, url)
    assert replay.outcome == "failed"
    assert sentence_of(replay, url) == "could not resolve demo-crm.invalid — edit the target's URL"


def test_a_receiver_that_does_not_answer_in_time_is_a_timeout_sentence(client, tenant, sink):
    sink.mode = "hang"
    replay = replay_to(client, tenant, f"{sink.url}/contacts", timeout_seconds=0.3)
    sink.release.set()
    assert replay.outcome == "ambiguous"
    assert sentence_of(replay, sink.url).startswith("127.0.0.1 did not answer in time — ")


def test_https_to_a_plain_http_receiver_is_a_tls_sentence(client, tenant, sink):
    url = sink.url.replace("http://", "https://") + "/contacts"
    replay = replay_to(client, tenant, url)
    assert replay.outcome == "failed"
    assert sentence_of(replay, url).startswith("the TLS handshake with 127.0.0.1 failed — check the URL's scheme")


def test_a_5xx_answer_says_the_error_is_on_the_receiver_s_side(client, tenant, sink):
    sink.mode, sink.status = "status", 503
    replay = replay_to(client, tenant, f"{sink.url}/contacts")
    assert sentence_of(replay, sink.url).startswith("127.0.0.1 answered HTTP 503, an error on its side — retry later")


def test_the_raw_error_is_behind_a_disclosure_and_scrubbed_like_every_stored_error():
    html = failure_html("sent, no answer: ReadTimeout to hooks.example.invalid:443: timed out token=s3cr3t-abc")
    assert html.startswith('<span class="og-failure" data-testid="failure-sentence">Hooks.example.invalid did not')
    raw = re.search(r"<details class=\"og-raw-error\"><summary>raw error</summary><code>(.*)</code></details>", html)
    assert raw and "token=[redacted]" in raw.group(1) and "s3cr3t" not in html
    refused = "not delivered: destination refused by the outbound policy: loopback address 127.0.0.1 port 8012 …"
    assert explain_failure(refused, url="http://127.0.0.1:8012/contacts").sentence == (
        "the outbound policy does not allow sending to 127.0.0.1:8012 — add it to OUTBOUND_ALLOW or edit the target's URL"
    )
    # Text that is no transport failure stays as it is (escaped), with no invented sentence.
    assert failure_html("CRM answered <429>") == "CRM answered &lt;429&gt;"


def test_the_entry_the_result_and_the_replay_s_operation_page_show_the_sentence_and_lead_on(
    client, tenant, outbound_allow
):
    url = f"http://127.0.0.1:{free_port()}/contacts"
    outbound_allow(url)
    dlq_targets.replay_target_upsert(tenant=tenant, slug="crm", url=url, is_default=True)
    event_id = client.post("/api/v1/dlq/events", ENVELOPE, format="json").json()["id"]
    console = client_for(User.objects.create_superuser("root", password="x"))
    # The replay's result, as the console says it after the replay.
    done = console.post(f"/admin/dlq/failedevent/{event_id}/replay/", {"note": "try"}, follow=True)
    text = done.content.decode()
    assert "Replay #1 to crm: failed — " in text and ">Connection refused by 127.0.0.1:" in text
    assert '<details class="og-raw-error"><summary>raw error</summary><code>not delivered: ConnectError' in text
    # The entry's page (its story and its replay history).
    entry = console.get(f"/admin/dlq/failedevent/{event_id}/change/").content.decode()
    assert 'data-testid="replay-failure"' in entry and "is the receiver running?" in entry
    # The replay's operation: back to the entry, replay again, edit the target, open the run.
    op = Replay.objects.get(event_id=event_id).operation_id
    page = console.get(f"/admin/ledger/operation/{op}/change/").content.decode()
    assert f'href="/admin/dlq/failedevent/{event_id}/change/" data-testid="replay-entry"' in page
    assert f'href="/admin/dlq/failedevent/{event_id}/replay/" data-testid="replay-again"' in page
    assert 'href="/admin/dlq/replaytarget/" data-testid="replay-target"' in page
    assert 'data-testid="replay-run"' in page and 'data-testid="failure"' in page
    assert ">Connection refused by 127.0.0.1:" in page


def test_the_demo_lead_replays_to_the_demo_s_mock_crm_out_of_the_box(monkeypatch, outbound_allow, mock_enforced):
    # make run starts the key-enforced mock at DEMO_PORT_BASE; the seed points the demo there.
    monkeypatch.setenv("DEMO_PORT_BASE", str(mock_enforced.port))
    made = demo_seed()
    console = client_for(User.objects.get(username="demo-admin"))
    done = console.post(f"/admin/dlq/failedevent/{made['dlq_stuck']}/replay/", {"note": "limit lifted"}, follow=True)
    assert "Replay #1 to demo-crm-webhook: succeeded (HTTP 201)." in done.content.decode()
    assert FailedEvent.objects.get(pk=made["dlq_stuck"]).status == "replayed"
    effects = mock_enforced.effects()
    # The contact was created in the mock CRM, under the lead's original key.
    assert effects["count"] == 1 and effects["by_key"] == {"demo:call_7f3c2a9e41b04d6f:crm-contact:v1": 1}
