"""BoundedJSONParser refuses exactly what parse-then-json_problem refuses, shortcut or not."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from config.parsers import MAX_JSON_DEPTH, BoundedJSONParser, clean_by_construction, json_problem


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


def test_random_documents_get_the_same_answer_and_most_skip_the_walk():
    rnd = random.Random(20260)
    skipped = 0
    for _ in range(3000):
        raw = json.dumps(random_value(rnd, 1), ensure_ascii=rnd.random() < 0.5).encode()
        assert bounded(raw, "utf-8") == reference(raw, "utf-8"), raw[:200]
        skipped += clean_by_construction(raw, "utf-8")
    assert skipped > 300


def test_a_body_with_a_lone_surrogate_is_never_taken_as_clean():
    assert not clean_by_construction(b'{"s": "\\ud800"}', "utf-8")
    assert not clean_by_construction(b'{"n": 1e400}', "utf-8")
    assert not clean_by_construction(nested(MAX_JSON_DEPTH + 1), "utf-8")
    assert not clean_by_construction(b'{"s": "x"}', "latin-1")
    assert clean_by_construction(b'{"key": "order-1", "request": {"amount": 1200}}', "utf-8")
    # Digits before an e inside a string (lease tokens, keys) do not look like a number.
    assert clean_by_construction(b'{"lease_token": "Qx1e9_-7E", "response": {"ok": true}}', "utf-8")
