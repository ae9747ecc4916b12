"""DRF serializers built once per thread and reused: the API's one speed-up off DRF's usual path.

DRF's usual path builds a serializer per request, and building one deep-copies every
declared field: ~85 % of the CPU a serializer costs. A claim's input serializer costs
~250 µs that way and ~35 µs reused; an operation's output serializer ~335 µs and ~45 µs.
Over HTTP that was worth +30–40 % fresh claim→complete ops/s (median of 7 interleaved
rounds, `python -m bench.compare`; docs/explanation/benchmarks.md), above the 10 % bar a shortcut must
clear to stay.

Next to nothing is re-implemented: ``validated_data`` runs the serializer's own steps
(every field's own ``run_validation``, validators, ``validate_<name>`` and ``validate``) and
``represented`` its own ``to_representation``, exactly what ``is_valid()`` and ``.data``
run, on field instances built once per thread instead of per call. The one shortcut: a
field the body lacks whose DRF answer is its plain default is set to that default (the
input plan below). A body it refuses is validated again by a fresh serializer, so every 400
carries ``is_valid()``'s own errors. tests/test_serializer_reuse.py holds that both answer exactly like a fresh serializer.

Only for serializers that read nothing of the serializer instance beyond its fields (no
``self.instance``, ``self.initial_data``, ``self.context`` or ``partial``): every input and
output serializer of the API is such.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import fields, serializers
from rest_framework.exceptions import ValidationError

_built = threading.local()


def prototype(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """This thread's instance of ``serializer_class``, its fields bound once."""
    cache: dict[type[serializers.Serializer], serializers.Serializer] | None = getattr(_built, "cache", None)
    if cache is None:
        cache = _built.cache = {}
    serializer = cache.get(serializer_class)
    if serializer is None:
        serializer = serializer_class()
        serializer.fields  # noqa: B018 - bind the field copies now, once
        cache[serializer_class] = serializer
    return serializer


def validated_data(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """``serializer_class(data=data)``'s ``validated_data`` after ``is_valid()``; raises the
    ValidationError ``is_valid(raise_exception=True)`` raises, with the same detail."""
    serializer = prototype(serializer_class)
    try:
        if type(data) is dict:
            return _planned_validation(serializer, data)
        return dict(serializer.run_validation(data))
    except (ValidationError, DjangoValidationError):
        pass
    # A refusal is answered by a serializer built for it: word for word is_valid()'s errors
    # (which reshape a few, e.g. a missing body), and refusals are not the hot path.
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# --- Input: a plan per serializer ---------------------------------------------------------------
#
# A body names a few of a serializer's fields (a claim: 4 of 18); DRF still walks every absent
# one through get_value → run_validation → validate_empty_values → get_default, to return the
# field's default: half the CPU a claim's validation costs. The plan, made once per thread and
# serializer, knows which fields would come back as their plain default when absent and sets
# that default; every field the body names goes through DRF's own steps, as do the
# serializer's validators and ``validate``.

_ABSENT_RUNS = object()  # marks a field whose absence DRF must still handle (no shortcut)

# The DRF methods whose behaviour for an absent value the shortcut repeats; a field class that
# overrides any of them is never short-cut.
_PLAIN_ABSENT = (
    ("get_value", (fields.Field.get_value, fields.JSONField.get_value)),
    ("validate_empty_values", (fields.Field.validate_empty_values,)),
    ("get_default", (fields.Field.get_default,)),
    ("run_validation", (fields.Field.run_validation, fields.CharField.run_validation)),
)


def _absent_value(field: fields.Field) -> Any:
    """What DRF validates ``field`` to when the body lacks it, or ``_ABSENT_RUNS``."""
    kind = type(field)
    if any(getattr(kind, name) not in plain for name, plain in _PLAIN_ABSENT):
        return _ABSENT_RUNS
    if field.required or field.default is fields.empty or callable(field.default):
        return _ABSENT_RUNS
    return field.default


def _input_plan(serializer: serializers.Serializer) -> tuple[list[tuple[Any, ...]], bool]:
    plans: dict[type, tuple[list[tuple[Any, ...]], bool]] | None = getattr(_built, "input_plans", None)
    if plans is None:
        plans = _built.input_plans = {}
    plan = plans.get(type(serializer))
    if plan is None:
        steps = [
            (
                field,
                field.field_name,
                field.source_attrs,
                getattr(serializer, "validate_" + field.field_name, None),
                _absent_value(field),
            )
            # DRF's writable fields (its private ``_writable_fields``), from its public ``fields``.
            for field in serializer.fields.values()
            if not field.read_only
        ]
        # The serializer's run_validators does nothing without validators or read-only defaults.
        validators = bool(serializer.validators) or any(f.read_only for f in serializer.fields.values())
        plan = plans[type(serializer)] = (steps, validators)
    return plan


def _planned_validation(serializer: serializers.Serializer, data: dict[str, Any]) -> dict[str, Any]:
    """``serializer.run_validation(data)`` for a JSON object body: DRF's steps field by field,
    except that an absent field with a plain default is that default. Raises on the first
    refusal (the caller answers it with a fresh serializer's errors)."""
    steps, validators = _input_plan(serializer)
    ret: dict[str, Any] = {}
    for field, name, source_attrs, validate_method, absent in steps:
        if absent is not _ABSENT_RUNS and name not in data:
            value = absent
        else:
            try:
                value = field.run_validation(field.get_value(data))
            except fields.SkipField:
                continue
        if validate_method is not None:
            value = validate_method(value)
        serializer.set_value(ret, source_attrs, value)
    if validators:
        serializer.run_validators(ret)
    value = serializer.validate(ret)
    assert value is not None, ".validate() should return the validated data"
    return dict(value)


def represented(serializer_class: type[serializers.Serializer], instance: Any) -> dict[str, Any]:
    """``serializer_class(instance).data`` as a plain dict (same keys, order and values)."""
    return prototype(serializer_class).to_representation(instance)
