"""The mock providers: a real HTTP server with a countable effect, enforced or advisory."""

from __future__ import annotations

import io
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

KEY = {"Idempotency-Key": "order-1001:charge:rev1"}


def charge(http: httpx.Client, url: str, body: dict | None = None, **headers: str) -> httpx.Response:
    return http.post(url + "/charges", json=body if body is not None else {"amount": 1000}, headers=headers)


# --- enforced -----------------------------------------------------------------------------


def test_enforced_provider_creates_an_object_on_the_first_request_and_counts_one_effect(http, mock_enforced):
    response = charge(http, mock_enforced.url, {"amount": 1000, "currency": "eur"}, **KEY)

    assert response.status_code == 201
    body = response.json()
    assert body["id"].startswith("ch_")
    assert body["status"] == "succeeded"
    assert body["idempotency_key"] == KEY["Idempotency-Key"]
    assert body["amount"] == 1000
    assert mock_enforced.effects()["count"] == 1


def test_enforced_provider_answers_repeat_with_stored_object_and_counts_one_effect(http, mock_enforced):
    first = charge(http, mock_enforced.url, **KEY)
    repeat = charge(http, mock_enforced.url, **KEY)

    assert (first.status_code, repeat.status_code) == (201, 200)
    assert repeat.json() == first.json()
    assert repeat.headers["Idempotent-Replayed"] == "true"
    effects = mock_enforced.effects()
    assert effects["count"] == 1
    assert effects["by_key"] == {KEY["Idempotency-Key"]: 1}
    assert effects["requests"] == 2


def test_enforced_provider_refuses_the_same_key_with_another_body_with_422(http, mock_enforced):
    charge(http, mock_enforced.url, {"amount": 1000}, **KEY)
    reused = charge(http, mock_enforced.url, {"amount": 9999}, **KEY)

    assert reused.status_code == 422
    assert reused.json() == {"error": "idempotency_key_reused"}
    assert mock_enforced.effects()["count"] == 1


def test_enforced_provider_treats_different_keys_as_different_effects(http, mock_enforced):
    charge(http, mock_enforced.url, **{"Idempotency-Key": "a"})
    charge(http, mock_enforced.url, **{"Idempotency-Key": "b"})

    assert mock_enforced.effects()["by_key"] == {"a": 1, "b": 1}


def test_enforced_provider_finds_an_object_by_key_by_id_and_by_the_callers_reference(http, mock_enforced):
    created = charge(http, mock_enforced.url, {"amount": 5, "reference": "handle-77"}, **KEY).json()

    by_key = http.get(mock_enforced.url + "/charges", params={"idempotency_key": KEY["Idempotency-Key"]})
    by_id = http.get(f"{mock_enforced.url}/charges/{created['id']}")
    by_key_path = http.get(f"{mock_enforced.url}/charges/{KEY['Idempotency-Key']}")
    by_reference = http.get(mock_enforced.url + "/charges/handle-77")

    for response in (by_key, by_id, by_key_path, by_reference):
        assert response.status_code == 200
        assert response.json() == created
    assert mock_enforced.effects()["lookups"] == 4


def test_enforced_provider_answers_404_for_an_unknown_key_or_ref(http, mock_enforced):
    charge(http, mock_enforced.url, **KEY)

    assert http.get(mock_enforced.url + "/charges", params={"idempotency_key": "nope"}).status_code == 404
    assert http.get(mock_enforced.url + "/charges/ch_nope").status_code == 404
    # A charge is not a contact.
    assert (
        http.get(mock_enforced.url + "/contacts", params={"idempotency_key": KEY["Idempotency-Key"]}).status_code == 404
    )


def test_forced_failed_outcome_answers_402_is_stored_as_failed_and_is_not_an_effect(http, mock_enforced):
    declined = charge(http, mock_enforced.url, **KEY, **{"X-Mock-Outcome": "failed"})
    repeat = charge(http, mock_enforced.url, **KEY)
    lookup = http.get(mock_enforced.url + "/charges", params={"idempotency_key": KEY["Idempotency-Key"]})

    assert declined.status_code == 402
    assert declined.json()["status"] == "failed"
    # Stripe replays a decline for the same key: the same 402, not a new charge.
    assert repeat.status_code == 402
    assert repeat.json()["id"] == declined.json()["id"]
    assert lookup.status_code == 200
    assert lookup.json()["status"] == "failed"
    effects = mock_enforced.effects()
    assert (effects["count"], effects["failed"], effects["objects"]) == (0, 1, 1)


def test_enforced_provider_answers_409_to_a_repeat_while_the_first_request_is_still_held(http, mock_enforced, wait_for):
    mock_enforced.script([{"delay": 0.5}])
    first: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: first.append(charge(http, mock_enforced.url, **KEY)))
    thread.start()
    assert wait_for(lambda: mock_enforced.effects()["requests"] == 1)

    concurrent = charge(http, mock_enforced.url, **KEY)
    thread.join(timeout=2)

    assert concurrent.status_code == 409
    assert concurrent.json() == {"error": "idempotency_key_in_use"}
    assert first[0].status_code == 201
    assert mock_enforced.effects()["count"] == 1


def test_a_retry_sent_the_moment_an_answer_arrives_never_finds_the_key_in_use(http, mock_enforced):
    mock_enforced.script([{"status": 503}] * 30)

    statuses = [charge(http, mock_enforced.url, **KEY).status_code for _ in range(31)]

    assert statuses == [503] * 30 + [201]


def test_concurrent_requests_with_one_key_make_exactly_one_effect(mock_enforced):
    def send(_: int) -> int:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            return charge(client, mock_enforced.url, **KEY).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(send, range(16)))

    assert statuses.count(201) == 1
    assert set(statuses) <= {200, 201, 409}
    assert mock_enforced.effects()["count"] == 1


def test_enforced_provider_accepts_post_paths_under_charges_and_contacts(http, mock_enforced):
    capture = http.post(mock_enforced.url + "/charges/ch_x/capture", json={}, headers={"Idempotency-Key": "c1"})
    contact = http.post(mock_enforced.url + "/contacts", json={"segment": "b2b"}, headers={"Idempotency-Key": "p1"})

    assert capture.status_code == 201
    assert contact.status_code == 201
    assert contact.json()["id"].startswith("ct_")
    assert http.get(mock_enforced.url + "/contacts", params={"idempotency_key": "p1"}).json() == contact.json()
    assert mock_enforced.effects()["count"] == 2


def test_the_idempotency_header_name_is_configurable(http, mock_provider_factory):
    provider = mock_provider_factory("enforced", "X-Request-Key")

    charge(http, provider.url, **{"X-Request-Key": "k"})
    charge(http, provider.url, **{"X-Request-Key": "k"})
    # The default header means nothing to this provider: two more effects.
    charge(http, provider.url, **KEY)
    charge(http, provider.url, **KEY)

    effects = provider.effects()
    assert effects["by_key"] == {"k": 1}
    assert effects["count"] == 3


# --- advisory -----------------------------------------------------------------------------


def test_advisory_provider_makes_a_new_effect_for_every_request_even_with_the_same_key(http, mock_advisory):
    first = charge(http, mock_advisory.url, **KEY)
    second = charge(http, mock_advisory.url, **KEY)

    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]
    effects = mock_advisory.effects()
    assert effects["count"] == 2
    # The duplicate is visible per key, which is the whole point of an advisory provider.
    assert effects["by_key"] == {KEY["Idempotency-Key"]: 2}


def test_advisory_provider_has_no_lookup(http, mock_advisory):
    created = charge(http, mock_advisory.url, **KEY).json()

    assert (
        http.get(mock_advisory.url + "/charges", params={"idempotency_key": KEY["Idempotency-Key"]}).status_code == 404
    )
    assert http.get(f"{mock_advisory.url}/charges/{created['id']}").status_code == 404


# --- scripts ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["enforced", "advisory"])
def test_scripted_error_answers_perform_no_effect_and_are_consumed_one_per_request(http, mock_provider_factory, mode):
    provider = mock_provider_factory(mode)
    provider.script([{"status": 429, "retry_after": 1}, {"status": 503}, {"status": 401}, {"status": 400}])

    statuses = [charge(http, provider.url, **KEY) for _ in range(5)]

    assert [r.status_code for r in statuses] == [429, 503, 401, 400, 201]
    assert statuses[0].headers["Retry-After"] == "1"
    effects = provider.effects()
    assert (effects["count"], effects["requests"]) == (1, 5)


def test_scripted_500_after_commit_performs_the_effect_and_a_repeat_gets_the_stored_object(http, mock_enforced):
    mock_enforced.script([{"status": 500, "commit": True}])

    failed = charge(http, mock_enforced.url, **KEY)
    repeat = charge(http, mock_enforced.url, **KEY)

    assert failed.status_code == 500
    assert repeat.status_code == 200
    assert repeat.json()["idempotency_key"] == KEY["Idempotency-Key"]
    assert mock_enforced.effects()["count"] == 1


def test_scripted_2xx_without_a_usable_ref_still_performs_the_effect(http, mock_enforced):
    mock_enforced.script([{"status": 201, "body": {"id": None}}])

    response = charge(http, mock_enforced.url, **KEY)
    lookup = http.get(mock_enforced.url + "/charges", params={"idempotency_key": KEY["Idempotency-Key"]})

    assert response.status_code == 201
    assert response.json() == {"id": None}
    assert lookup.status_code == 200
    assert lookup.json()["id"].startswith("ch_")
    assert mock_enforced.effects()["count"] == 1


def test_scripted_delay_exceeds_the_callers_deadline_but_the_effect_still_happens(mock_enforced, wait_for):
    mock_enforced.script([{"delay": 0.5}])

    with httpx.Client(timeout=0.1, trust_env=False) as impatient, pytest.raises(httpx.ReadTimeout):
        charge(impatient, mock_enforced.url, **KEY)

    assert mock_enforced.effects()["count"] == 0
    assert wait_for(lambda: mock_enforced.effects()["count"] == 1)


def test_scripted_drop_performs_the_effect_and_closes_without_an_answer(http, mock_advisory):
    mock_advisory.script([{"drop": True}])

    with pytest.raises(httpx.RemoteProtocolError):
        charge(http, mock_advisory.url, **KEY)

    assert mock_advisory.effects()["count"] == 1


def test_scripted_outcome_and_headers_shape_the_answer(http, mock_enforced):
    mock_enforced.script([{"outcome": "failed", "headers": {"X-Trace": "t1"}}])

    response = charge(http, mock_enforced.url, **KEY)

    assert response.status_code == 402
    assert response.headers["X-Trace"] == "t1"
    assert mock_enforced.effects()["failed"] == 1


@pytest.mark.parametrize(
    "script",
    [{"status": 500}, [{"stauts": 500}], [{"status": 99}], [{"delay": -1}], [{"delay": 10_000}], ["x"]],
)
def test_a_malformed_script_is_refused_with_400_and_changes_nothing(http, mock_enforced, script):
    response = http.post(mock_enforced.url + "/_script", json=script)

    assert response.status_code == 400
    assert http.get(mock_enforced.url + "/_script").json() == {"pending": 0}


def test_reset_forgets_effects_keys_and_script(http, mock_enforced):
    charge(http, mock_enforced.url, **KEY)
    mock_enforced.script([{"status": 503}])

    mock_enforced.reset()

    assert mock_enforced.effects()["count"] == 0
    assert mock_enforced.effects()["requests"] == 0
    # The key is forgotten and the 503 step is gone: a fresh 201.
    assert charge(http, mock_enforced.url, **KEY).status_code == 201


# --- hygiene ------------------------------------------------------------------------------


def test_invalid_json_and_oversized_bodies_are_refused_without_an_effect(http, mock_enforced):
    bad = http.post(mock_enforced.url + "/charges", content=b"{not json", headers=KEY)
    huge = http.post(mock_enforced.url + "/charges", content=b"x" * (1024 * 1024 + 1), headers=KEY)

    assert bad.status_code == 400
    assert huge.status_code == 413
    assert mock_enforced.effects()["count"] == 0


def test_bodies_and_query_strings_are_never_logged(http, mock_enforced):
    logger = logging.getLogger("onceguard.relay")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        charge(http, mock_enforced.url, {"email": "jane.doe@example.com"}, **KEY)
        http.get(mock_enforced.url + "/charges", params={"idempotency_key": "jane.doe@example.com"})
        http.post(mock_enforced.url + "/charges", content=b"jane.doe@example.com", headers=KEY)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)

    logged = stream.getvalue()
    assert "POST /charges" in logged
    assert "jane.doe" not in logged
