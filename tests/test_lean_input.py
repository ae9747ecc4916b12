"""The lean validator accepts exactly what the DRF serializer accepts, with the same values.

Differential: thousands of bodies built from valid, edge and wrong-typed values, each
validated both ways. Where the lean path accepts, DRF must accept with equal values of the
same types; where DRF refuses, the lean path must raise DRF's own error (it hands over).
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from config import lean_input
from config.lean_input import lean_validator
from ledger.serializers import (
    ClaimInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
    HeartbeatInputSerializer,
    SentInputSerializer,
    SubmitInputSerializer,
)

HOT_SERIALIZERS = [
    ClaimInputSerializer,
    SubmitInputSerializer,
    SentInputSerializer,
    HeartbeatInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
]

POOL: list[Any] = [
    "",
    " ",
    "  padded  ",
    "\tpadded\n",
    "stripe",
    "not a slug!",
    "slug-ok_1",
    "transient",
    "permanent",
    "TRANSIENT",
    "tok_" + "a" * 60,
    "a" * 64,
    "a" * 65,
    "a" * 100,
    "a" * 101,
    "h" * 255,
    "h" * 256,
    "m" * 5000,
    "m" * 5001,
    "a\x00b",
    "\x00",
    "emoji \U0001f600",
    "\ud800",
    "1.5",
    "200",
    "true",
    "null",
    0,
    1,
    -1,
    5,
    99,
    100,
    200,
    599,
    600,
    2**70,
    10**400,
    0.0,
    -0.0,
    -0.5,
    1.5,
    200.0,
    1e308,
    float("inf"),
    True,
    False,
    None,
    [],
    [1, "a"],
    ["a\x00"],
    {},
    {"amount": 1200, "currency": "eur"},
    {"note": "a\x00b"},
    {"a\x00": 1},
    {"nested": {"deep": [1, {"x": None}]}},
]


def drf(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def typed(data: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {name: (type(value), value) for name, value in data.items()}


def outcome(validate: Any, data: Any) -> tuple[str, Any]:
    try:
        return "ok", typed(validate(data))
    except ValidationError as exc:
        return "refused", exc.detail


def bodies(serializer_class: type[serializers.Serializer], n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    names = list(serializer_class().fields)
    valid = {name: [v for v in POOL if _accepts(serializer_class, name, v)] for name in names}
    out = []
    for _ in range(n):
        body: dict[str, Any] = {}
        for name in names:
            roll = rnd.random()
            if roll < 0.15:
                continue  # absent
            # Mostly values the field accepts, so whole bodies are often valid.
            choices = valid[name] if roll < 0.8 and valid[name] else POOL
            body[name] = rnd.choice(choices)
        if rnd.random() < 0.2:
            body["unknown_field"] = rnd.choice(POOL)
        out.append(body)
    return out


def _accepts(serializer_class: type[serializers.Serializer], name: str, value: Any) -> bool:
    field = serializer_class().fields[name]
    try:
        field.run_validation(value)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("serializer_class", HOT_SERIALIZERS, ids=lambda c: c.__name__)
def test_the_hot_input_serializers_are_compiled_not_handed_to_drf_every_time(serializer_class):
    lean_input._compile(serializer_class)  # raises _Unsupported if it would always fall back


@pytest.mark.parametrize("serializer_class", HOT_SERIALIZERS, ids=lambda c: c.__name__)
def test_lean_and_drf_agree_on_every_body(serializer_class):
    lean = lean_validator(serializer_class)
    accepted = 0
    for body in bodies(serializer_class, 3000, seed=zlib.crc32(serializer_class.__name__.encode())):
        expected = outcome(lambda data: drf(serializer_class, data), body)
        got = outcome(lean, body)
        assert got == expected, {name: str(value)[:40] for name, value in body.items()}
        accepted += got[0] == "ok"
    # The comparison is only worth something if both sides were exercised.
    assert 300 < accepted < 2900, accepted


@pytest.mark.parametrize("data", [[], "text", 42, None, [{"lease_token": "t"}]])
def test_a_body_that_is_not_an_object_gets_drfs_answer(data):
    lean = lean_validator(CompleteInputSerializer)

    assert outcome(lean, data) == outcome(lambda d: drf(CompleteInputSerializer, d), data)


def test_a_serializer_with_rules_the_lean_path_does_not_mirror_is_always_validated_by_drf():
    class WithHook(serializers.Serializer):
        name = serializers.CharField()

        def validate_name(self, value: str) -> str:
            if value == "forbidden":
                raise serializers.ValidationError("no")
            return value.upper()

    lean = lean_validator(WithHook)

    assert lean({"name": "ok"}) == {"name": "OK"}
    with pytest.raises(ValidationError):
        lean({"name": "forbidden"})


def test_a_project_validator_on_a_field_is_still_applied():
    lean = lean_validator(CompleteInputSerializer)

    with pytest.raises(ValidationError) as refused:
        lean({"lease_token": "t", "response": {"note": "a\x00b"}})

    assert "response" in refused.value.detail
