""" "Hash this field into the key" (ledger.rules.key_derivation, ``POST /api/v1/keys/derive``): the same
value always gives the same key, a key the key rule accepts; two tenants get different keys;
the key id of the dedicated derivation key is part of the key; the value is never logged nor
echoed; bad input is a 400."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from ledger.models import Operation
from ledger.rules import key_derivation
from ledger.rules.key_rules import key_rule_broken
from tests.ledger.support import CLAIM_URL, assert_problem, claim_body

pytestmark = pytest.mark.django_db

URL = "/api/v1/keys/derive"
# Not shaped like anything the log pipeline masks: if it reached a log line it would show.
SECRET_VALUE = "lead-value-7f3a9c-never-logged"
DERIVED = re.compile(r"^lead:h1:[a-z2-7]{32}$")


@pytest.fixture(autouse=True)
def _own_derivation_key(settings: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A fresh var/ per test: the file key is made on first use there.
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv(key_derivation.KEY_ENV, raising=False)
    key_derivation._cache.clear()
    yield
    key_derivation._cache.clear()


def _derive(client: Any, **body: Any) -> str:
    response = client.post(URL, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()["key"]


def test_the_same_value_always_gives_the_same_key_which_the_key_rule_accepts(api):
    first = _derive(api, value="jane.doe@example.com", prefix="lead")
    again = _derive(api, value="jane.doe@example.com", prefix="lead")
    key_derivation._cache.clear()  # a new process reads the same file
    later = _derive(api, value="jane.doe@example.com", prefix="lead")

    assert first == again == later
    assert DERIVED.match(first), first
    assert key_rule_broken(first) is None
    assert _derive(api, value="john@example.com", prefix="lead") != first


def test_a_derived_key_is_claimed_like_any_key(api):
    key = _derive(api, value="+61412345678", prefix="lead")
    assert api.post(CLAIM_URL, claim_body(key), format="json").status_code == 201
    assert Operation.objects.get().key == key


def test_two_tenants_deriving_from_the_same_value_get_different_keys(api, other_tenant, make_client):
    other = make_client(other_tenant)
    assert _derive(api, value="jane.doe@example.com") != _derive(other, value="jane.doe@example.com")


def test_named_fields_are_hashed_together_whatever_their_order(api):
    one = _derive(api, parts={"email": "jane@example.com", "list": 7}, prefix="lead")
    two = _derive(api, parts={"list": 7, "email": "jane@example.com"}, prefix="lead")
    assert one == two
    assert one != _derive(api, parts={"email": "jane@example.com", "list": 8}, prefix="lead")
    assert one != _derive(api, value="jane@example.com", prefix="lead")


def test_the_key_id_of_a_configured_derivation_key_is_part_of_the_key(api, monkeypatch):
    from_file = _derive(api, value="jane@example.com")
    monkeypatch.setenv(key_derivation.KEY_ENV, "k2:" + "s" * 40)
    configured = _derive(api, value="jane@example.com")
    assert configured.startswith("k2:") and from_file.startswith("h1:")
    assert configured.split(":")[1] != from_file.split(":")[1]


def test_the_answer_names_the_key_id_and_a_read_only_api_key_may_derive(tenant, provider, make_client):
    reader = make_client(tenant, scopes=["read"])
    response = reader.post(URL, {"value": "jane@example.com", "prefix": "lead"}, format="json")
    assert response.status_code == 200
    assert response.json()["key_id"] == "h1"


def test_the_value_is_never_logged_nor_echoed_even_in_a_refusal(api, caplog):
    caplog.set_level(logging.DEBUG)
    ok = api.post(URL, {"value": SECRET_VALUE, "prefix": "lead"}, format="json")
    refused = api.post(URL, {"parts": {"email": [SECRET_VALUE]}, "prefix": "lead"}, format="json")
    both = api.post(URL, {"value": SECRET_VALUE, "parts": {"a": SECRET_VALUE}}, format="json")

    assert ok.status_code == 200
    for response in (ok, refused, both):
        assert SECRET_VALUE.encode() not in response.content
    assert assert_problem(refused, 400, "validation_error")
    logged = caplog.text + "".join(repr(r.args) + repr(r.__dict__) for r in caplog.records)
    assert SECRET_VALUE not in logged
    assert "key_derived" in logged and "prefix=lead" in logged  # the derivation itself is logged, without it


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"value": ""},
        {"value": "x" * 10_001},
        {"value": "a", "parts": {"b": "c"}},
        {"parts": {}},
        {"parts": {"email": {"nested": "x"}}},
        {"parts": {"email": True}},
        {"parts": {"bad name": "x"}},
        {"parts": ["a", "b"]},
        {"value": "a", "prefix": "jane@example.com"},
        {"value": "a", "prefix": "-lead"},
    ],
)
def test_bad_input_is_a_400_never_a_5xx(api, body):
    assert_problem(api.post(URL, body, format="json"), 400, "validation_error")


def test_a_malformed_configured_key_is_refused_at_use(monkeypatch):
    monkeypatch.setenv(key_derivation.KEY_ENV, "h1:short")
    with pytest.raises(key_derivation.KeyDerivationKeyError):
        key_derivation.derivation_key()


def test_the_derivation_key_file_is_made_once_with_mode_600_and_kept(api, settings):
    first = _derive(api, value="jane@example.com")
    path = key_derivation.key_file_path()
    assert path.parent == settings.VAR_DIR
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    key_derivation._cache.clear()
    assert _derive(api, value="jane@example.com") == first
    assert path.read_text() == text
