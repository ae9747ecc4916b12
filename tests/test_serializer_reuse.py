"""ledger.protocol.serializer_reuse answers exactly like a serializer built per call.

Input, differential: thousands of bodies built from valid, edge and wrong-typed values,
each validated by a fresh serializer's is_valid() and by the reused one: the same values
of the same types when accepted, the same error detail (messages and codes) when refused.
Output: operations in every shape (guard and execute, finished and open, with and without a
recorded response, encrypted or not) render to the same JSON as ``Serializer(op).data``.
"""

from __future__ import annotations

import random
import threading
import zlib
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer

from dlq.web.serializers import BulkReplayInputSerializer, CloseInputSerializer, ReplayInputSerializer
from ledger.models import Operation
from ledger.platform.crypto import seal_json
from ledger.protocol.representation import ClaimOutputSerializer, OperationOutputSerializer
from ledger.protocol.serializer_reuse import represented, validated_data
from ledger.web.serializers import (
    ClaimInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
    HeartbeatInputSerializer,
    SentInputSerializer,
    SubmitInputSerializer,
)
from review.decisions.serializers import DecisionInputSerializer

INPUT_SERIALIZERS = [
    ClaimInputSerializer,
    SubmitInputSerializer,
    SentInputSerializer,
    HeartbeatInputSerializer,
    CompleteInputSerializer,
    FailInputSerializer,
    ReplayInputSerializer,
    CloseInputSerializer,
    BulkReplayInputSerializer,
    DecisionInputSerializer,
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
    "confirm_succeeded",
    "safe_to_retry",
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
            if roll < 0.15 or (not valid[name] and roll < 0.9):
                continue  # absent (mostly, for a field no pooled value satisfies)
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


def reused(serializer_class: type[serializers.Serializer]) -> Any:
    return lambda data: validated_data(serializer_class, data)


def detail_with_codes(detail: Any) -> Any:
    """ErrorDetail compares by text only; compare the codes too."""
    if isinstance(detail, dict):
        return {k: detail_with_codes(v) for k, v in detail.items()}
    if isinstance(detail, list):
        return [detail_with_codes(v) for v in detail]
    return (str(detail), getattr(detail, "code", None))


def outcome_with_codes(validate: Any, data: Any) -> tuple[str, Any]:
    try:
        return "ok", typed(validate(data))
    except ValidationError as exc:
        return "refused", detail_with_codes(exc.detail)


@pytest.mark.parametrize("serializer_class", INPUT_SERIALIZERS, ids=lambda c: c.__name__)
def test_reused_and_fresh_serializers_agree_on_every_body(serializer_class):
    accepted = 0
    for body in bodies(serializer_class, 1500, seed=zlib.crc32(serializer_class.__name__.encode())):
        expected = outcome_with_codes(lambda data: drf(serializer_class, data), body)
        got = outcome_with_codes(reused(serializer_class), body)
        assert got == expected, {name: str(value)[:40] for name, value in body.items()}
        accepted += got[0] == "ok"
    # The comparison is only worth something if both sides were exercised.
    assert 0 < accepted < 1500, accepted


@pytest.mark.parametrize("data", [[], "text", 42, None, [{"lease_token": "t"}]])
def test_a_body_that_is_not_an_object_gets_the_same_answer(data):
    expected = outcome_with_codes(lambda d: drf(CompleteInputSerializer, d), data)

    assert outcome_with_codes(reused(CompleteInputSerializer), data) == expected


def test_a_serializer_with_its_own_validate_hooks_is_run_as_declared():
    class WithHooks(serializers.Serializer):
        name = serializers.CharField()

        def validate_name(self, value: str) -> str:
            if value == "forbidden":
                raise serializers.ValidationError("no")
            return value.upper()

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if attrs["name"] == "OTHER":
                raise serializers.ValidationError("not that one")
            return attrs

    for body in ({"name": "ok"}, {"name": "forbidden"}, {"name": "other"}, {}):
        expected = outcome_with_codes(lambda d: drf(WithHooks, d), body)
        assert outcome_with_codes(reused(WithHooks), body) == expected


def test_absent_fields_come_back_as_drf_makes_them_whatever_their_default():
    """The input plan sets a plain default for an absent field itself; every other kind of
    absence (required, no default, a callable default, a field class with its own empty
    handling, a hook on the default, a dotted source) still goes through DRF."""
    calls: list[str] = []

    class Counted(serializers.CharField):
        def get_default(self) -> Any:
            calls.append("get_default")
            return "counted"

    class Blanked(serializers.CharField):
        def run_validation(self, data: Any = serializers.empty) -> Any:
            return "blank" if data is serializers.empty else super().run_validation(data)

    class Shapes(serializers.Serializer):
        plain = serializers.CharField(required=False, default="p")
        nothing = serializers.CharField(required=False)
        needed = serializers.CharField()
        made = serializers.ListField(required=False, default=list)
        counted = Counted(required=False, default="unused")
        blanked = Blanked(required=False, default="unused")
        hooked = serializers.IntegerField(required=False, default=3)
        nested = serializers.CharField(required=False, default="n", source="inner.value")

        def validate_hooked(self, value: int) -> int:
            return value * 2

    for body in ({"needed": "x"}, {"needed": "x", "plain": "q", "hooked": 4, "nested": "m"}, {}, {"plain": 1}):
        calls.clear()
        expected = outcome_with_codes(lambda d: drf(Shapes, d), body)
        fresh_calls = list(calls)
        calls.clear()
        assert outcome_with_codes(reused(Shapes), body) == expected
        assert calls == fresh_calls


def test_threads_validate_concurrently_without_sharing_state():
    results: list[Any] = []

    def work(n: int) -> None:
        for i in range(200):
            body = {"lease_token": f"t{n}-{i}", "response_status": 100 + (i % 600)}
            results.append((outcome_with_codes(reused(CompleteInputSerializer), body), body))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(results) == 800
    for got, body in results:
        assert got == outcome_with_codes(lambda d: drf(CompleteInputSerializer, d), body)


def operations() -> list[Operation]:
    now = timezone.now()
    base = {"pk": 7, "key": "order-1:charge:v1", "action": "charge", "attempts": 1, "max_attempts": 4}
    return [
        Operation(**base, status="claimed", mode="guard", lease_token="t" * 43, lease_expires_at=now),
        Operation(
            **base,
            status="succeeded",
            mode="guard",
            provider_ref="ch_1",
            response_status=201,
            response_body=seal_json({"id": "ch_1", "note": "caf\u00e9 \u2028"}),
            created_at=now - timedelta(seconds=3),
            updated_at=now,
            done_at=now,
            sent_at=now - timedelta(seconds=1),
        ),
        Operation(**base, status="failed", mode="guard", response_status=422, response_body=None, error_class="x"),
        Operation(**base, status="succeeded", mode="guard", response_status=None, response_body={"plain": [1, 2.5]}),
        Operation(
            **base,
            status="retry_wait",
            mode="execute",
            throttled_attempts=2,
            deadline=now + timedelta(minutes=5),
            expires_at=now + timedelta(minutes=30),
            next_attempt_at=now + timedelta(seconds=1, microseconds=250),
            callback_url="https://hooks.example.com/onceguard/1",
            superseded_by_id=9,
        ),
    ]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "serializer_class", [OperationOutputSerializer, ClaimOutputSerializer], ids=lambda c: c.__name__
)
def test_reused_output_serializers_render_exactly_like_fresh_ones(serializer_class, provider):
    renderer = JSONRenderer()
    for op in operations():
        op.provider_id = provider.pk
        fresh = serializer_class(op).data
        reused_body = represented(serializer_class, op)
        assert list(reused_body) == list(fresh)
        assert renderer.render(reused_body) == renderer.render(fresh)
