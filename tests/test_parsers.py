"""BoundedJSONParser refuses exactly what parse-then-json_problem refuses; the API answers
hostile JSON (too deep, non-finite numbers, lone surrogates, huge integers) and oversized
bodies with problem+json, before anything is stored."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from config.parsers import MAX_JSON_DEPTH, BoundedJSONParser, json_problem
from tests.ledger.support import CLAIM_URL


def reference(raw: bytes, encoding: str) -> Any:
    """The parser as it was: DRF's JSON parser, then the walk over every value."""
    try:
        data = JSONParser().parse(io.BytesIO(raw), None, {"encoding": encoding})
    except RecursionError:
        return "refused"
    except ParseError:
        return "refused"
    return "refused" if json_problem(data) is not None else ("ok", data)


def bounded(raw: bytes, encoding: str) -> Any:
    try:
        return "ok", BoundedJSONParser().parse(io.BytesIO(raw), None, {"encoding": encoding})
    except ParseError:
        return "refused"


def nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


EDGE_BODIES = [
    b'{"key": "order-1", "provider": "stripe", "request": {"amount": 1200}}',
    b'{"n": 1e400}',
    b'{"n": -1E400}',
    b'{"n": 1e300}',
    b"1e400",
    b" -1e400",
    b"[1e400]",
    b'{"a":[0,\n 1E+400]}',
    b'{"a":\t9.5e999}',
    b'{"lease_token": "a1e9_-Zz", "n": 1}',
    b'{"s": "x:1e400"}',
    b'{"n": 1.5e-400}',
    b'{"n": ' + b"9" * 309 + b".0}",
    b'{"n": ' + b"9" * 308 + b".0}",
    b'{"n": ' + b"9" * 400 + b"}",
    b'{"s": "\\ud800"}',
    b'{"\\udfff": 1}',
    b'{"s": "\\ud83d\\ude00"}',
    b'{"s": "\\u00e9"}',
    b'{"s": "\xc3\xa9 caf\xc3\xa9"}',
    b'{"s": "\xed\xa0\x80"}',
    b'{"s": "text with 1e5 inside and \\\\u escaped"}',
    b'{"n": NaN}',
    b'{"n": Infinity}',
    nested(MAX_JSON_DEPTH),
    nested(MAX_JSON_DEPTH + 1),
    b"[" * 10_000 + b"]" * 10_000,
    b"[]",
    b"{}",
    b"",
    b"{",
]


@pytest.mark.parametrize("raw", EDGE_BODIES, ids=range(len(EDGE_BODIES)))
@pytest.mark.parametrize("encoding", ["utf-8", "UTF8", "latin-1", "utf-16"])
def test_edge_bodies_get_the_same_answer(raw, encoding):
    assert bounded(raw, encoding) == reference(raw, encoding)


def answer(parser: JSONParser, raw: bytes, encoding: str) -> Any:
    """What ``parser`` makes of ``raw``: the value, or the refusal's detail, word for word."""
    try:
        return "ok", parser.parse(io.BytesIO(raw), None, {"encoding": encoding})
    except ParseError as exc:
        return "refused", str(exc.detail)
    except RecursionError:  # DRF's own parser lets it through; BoundedJSONParser names it
        return "refused", "JSON nested too deeply."


UNDECODABLE_BODIES = [
    b'{"a": 1}\xe2',  # a sequence cut off at the end: DRF's stream reader drops it
    b'{"a": 1}\xe2\x82',
    b'{"a": "\xff"}',
    b'{"a": "caf\xc3"}',
    b"\xef\xbb\xbf{}",  # a byte-order mark
    b"\xc3\xa9",
]


@pytest.mark.parametrize("raw", EDGE_BODIES[:-3] + UNDECODABLE_BODIES, ids=range(len(EDGE_BODIES) - 3 + 6))
@pytest.mark.parametrize("encoding", ["utf-8", "UTF8", "utf_8", "U8", "latin-1", "no-such-charset", "bz2_codec"])
def test_a_body_reads_as_drf_reads_it_word_for_word(raw, encoding):
    """The one-call UTF-8 decode gives DRF's parser's value or refusal, its message included
    (the hostile-JSON walk after it aside): bodies that do not decode go to DRF's own path."""
    expected = answer(JSONParser(), raw, encoding)
    got = answer(BoundedJSONParser(), raw, encoding)
    if expected[0] == "ok" and json_problem(expected[1]) is not None:
        assert got[0] == "refused"
    else:
        assert got == expected


def random_value(rnd: random.Random, depth: int) -> Any:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] if depth < 8 else [])
    kind = rnd.choice(kinds)
    if kind == "int":
        return rnd.choice([0, -1, 7, 10**20, -(10**30)])
    if kind == "float":
        return rnd.choice([0.5, -2.25, 1e-7, 3.0e200, 1e21, 123456.789])
    if kind == "str":
        return rnd.choice(["", "plain", "caf\u00e9", "\U0001f600", "line\nbreak", 'quote"', "e5", "1e5"])
    if kind == "bool":
        return rnd.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {rnd.choice(["a", "b", "k\u00e9y", "1e9"]): random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def test_random_documents_get_the_same_answer():
    rnd = random.Random(20260)
    for _ in range(3000):
        raw = json.dumps(random_value(rnd, 1), ensure_ascii=rnd.random() < 0.5).encode()
        assert bounded(raw, "utf-8") == reference(raw, "utf-8"), raw[:200]


HOSTILE_BODIES = {
    "too deep": nested(MAX_JSON_DEPTH + 1),
    "far too deep": b"[" * 100_000 + b"]" * 100_000,
    "overflows to infinity": b'{"provider": "p", "request": {"n": 1e400}}',
    "NaN": b'{"provider": "p", "request": {"n": NaN}}',
    "Infinity": b'{"provider": "p", "request": {"n": -Infinity}}',
    "lone surrogate": b'{"provider": "p", "request": {"s": "\\ud800"}}',
    "a 5000-digit integer": b'{"provider": "p", "request": {"n": ' + b"9" * 5000 + b"}}",
    "not JSON": b"{",
}


@pytest.mark.django_db
@pytest.mark.parametrize("raw", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
def test_hostile_json_gets_a_400_problem_and_stores_nothing(api, raw):
    from ledger.models import Operation

    response = api.generic("POST", CLAIM_URL, raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="hostile-1")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "malformed_json"
    assert not Operation.objects.exists()


@pytest.mark.django_db
def test_a_body_over_the_limit_gets_a_413_problem_before_it_is_parsed(api, settings):
    settings.MAX_REQUEST_BYTES = 1000
    raw = json.dumps({"provider": "p", "request": {"pad": "x" * 2000}}).encode()

    response = api.generic("POST", CLAIM_URL, raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="big-1")

    assert response.status_code == 413
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "payload_too_large" and response.json()["limit"] == 1000
