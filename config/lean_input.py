"""Validate a hot request body by a DRF input serializer's rules without building one.

Constructing a Serializer deep-copies every declared field and validating runs each
field's full machinery: ~0.6 ms of CPU per request for a claim, more than the ledger's own
work. ``lean_validator(SerializerClass)`` reads the serializer's declared fields once and
compiles the checks of the *valid* case: exact JSON types (str, int, float, bool, null),
lengths, ranges, patterns, choices, defaults and the field's own extra validators.

It only ever accepts. Anything it is not sure of (a wrong type, a value DRF would coerce
such as ``"5"`` for a number, a failed check, a field kind it does not know) hands the body
to the real serializer, so every refusal, message and coercion is DRF's own. The DRF class
stays the one place the rules are declared (and what the OpenAPI schema documents).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

from django.core import validators as django_validators
from rest_framework import fields as drf_fields
from rest_framework import serializers
from rest_framework import validators as drf_validators
from rest_framework.fields import empty
from rest_framework.utils import json as drf_json

Validator = Callable[[dict[str, Any]], dict[str, Any]]

# Returned by a field check: "not sure, let DRF decide".
_UNSURE = object()
_MISSING = object()

_SURROGATE = re.compile("[\ud800-\udfff]")


class _Unsupported(Exception):
    """The serializer uses something this module does not mirror: always use DRF."""


def _value_check(validator: Any) -> Callable[[Any], bool]:
    """A predicate that is true when ``validator`` would accept the (converted) value."""
    vtype = type(validator)
    if vtype is django_validators.ProhibitNullCharactersValidator:
        return lambda v: "\x00" not in v
    if vtype is drf_validators.ProhibitSurrogateCharactersValidator:
        return lambda v: _SURROGATE.search(v) is None
    if vtype in (django_validators.MaxLengthValidator, django_validators.MinLengthValidator):
        limit = validator.limit_value
        if callable(limit):
            raise _Unsupported(f"callable limit in {validator!r}")
        if vtype is django_validators.MaxLengthValidator:
            return lambda v: len(v) <= limit
        return lambda v: len(v) >= limit
    if vtype in (django_validators.MaxValueValidator, django_validators.MinValueValidator):
        limit = validator.limit_value
        if callable(limit):
            raise _Unsupported(f"callable limit in {validator!r}")
        if vtype is django_validators.MaxValueValidator:
            return lambda v: v <= limit
        return lambda v: v >= limit
    if vtype is django_validators.RegexValidator:
        if validator.inverse_match:
            raise _Unsupported("inverse regex")
        regex = validator.regex
        return lambda v: regex.search(v) is not None
    if getattr(validator, "requires_context", False):
        raise _Unsupported(f"context validator {validator!r}")

    # A validator of the project's own (e.g. no NUL characters in JSON): run it as is.
    def passes(v: Any) -> bool:
        try:
            validator(v)
        except Exception:
            return False
        return True

    return passes


def _converter(field: drf_fields.Field) -> Callable[[Any], Any]:
    """value -> internal value, or _UNSURE. Only exact JSON types of the valid case."""
    ftype = type(field)
    if ftype in (drf_fields.CharField, drf_fields.SlugField):
        allow_blank, trim = field.allow_blank, field.trim_whitespace

        def char(v: Any) -> Any:
            if type(v) is not str:
                return _UNSURE  # DRF turns numbers into strings, refuses the rest
            stripped = v.strip()
            if v == "" or (trim and stripped == ""):
                return "" if allow_blank else _UNSURE
            return stripped if trim else v

        return char
    if ftype is drf_fields.FloatField:

        def number(v: Any) -> Any:
            if type(v) is not float and type(v) is not int:
                return _UNSURE
            try:
                value = float(v)
            except OverflowError:
                return _UNSURE
            return value if math.isfinite(value) else _UNSURE

        return number
    if ftype is drf_fields.IntegerField:
        return lambda v: v if type(v) is int else _UNSURE
    if ftype is drf_fields.BooleanField:
        return lambda v: v if v is True or v is False else _UNSURE
    if ftype is drf_fields.ChoiceField:
        choices = field.choice_strings_to_values
        allow_blank = field.allow_blank

        def choice(v: Any) -> Any:
            if type(v) is not str:
                return _UNSURE
            if v == "" and allow_blank:
                return ""
            return choices.get(v, _UNSURE)

        return choice
    if ftype is drf_fields.JSONField:
        if field.binary:
            raise _Unsupported("binary JSONField")
        encoder = field.encoder

        def any_json(v: Any) -> Any:
            try:
                # DRF's json refuses NaN and infinities, as JSONField does.
                drf_json.dumps(v, cls=encoder)
            except (TypeError, ValueError):
                return _UNSURE
            return v

        return any_json
    raise _Unsupported(f"field type {ftype.__name__}")


def _compile(serializer_class: type[serializers.Serializer]) -> list[tuple[str, Callable[[Any], Any], Any]]:
    serializer = serializer_class()
    if type(serializer).validate is not serializers.Serializer.validate or serializer.validators:
        raise _Unsupported("serializer-level validation")
    plan = []
    for name, field in serializer.fields.items():
        if field.read_only or field.source != name or hasattr(serializer, f"validate_{name}"):
            raise _Unsupported(f"field {name}: read-only, a source or validate_{name}")
        default = field.default
        if default is not empty and callable(default):
            raise _Unsupported(f"field {name}: callable default")
        convert = _converter(field)
        checks = [_value_check(v) for v in field.validators]
        required, allow_null = field.required, field.allow_null
        # DRF answers a blank CharField before running its validators (CharField.run_validation).
        blank_skips_checks = isinstance(field, drf_fields.CharField)

        def check(
            value: Any,
            convert: Callable[[Any], Any] = convert,
            checks: list[Callable[[Any], bool]] = checks,
            required: bool = required,
            allow_null: bool = allow_null,
            default: Any = default,
            blank_skips_checks: bool = blank_skips_checks,
        ) -> Any:
            if value is _MISSING:
                if required:
                    return _UNSURE
                return _MISSING if default is empty else default
            if value is None:
                return None if allow_null else _UNSURE
            converted = convert(value)
            if converted is _UNSURE or (blank_skips_checks and converted == ""):
                return converted
            for passes in checks:
                if not passes(converted):
                    return _UNSURE
            return converted

        plan.append((name, check, default))
    return plan


@functools.cache
def lean_validator(serializer_class: type[serializers.Serializer]) -> Validator:
    """A function body -> validated data, equal to ``serializer_class(data=body)``'s
    ``validated_data`` as a dict; raises DRF's ValidationError for what DRF refuses."""

    def by_drf(data: Any) -> dict[str, Any]:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    try:
        plan = _compile(serializer_class)
    except _Unsupported:
        return by_drf

    def validate(data: Any) -> dict[str, Any]:
        if type(data) is not dict:
            return by_drf(data)
        out: dict[str, Any] = {}
        for name, check, _ in plan:
            value = check(data.get(name, _MISSING))
            if value is _UNSURE:
                return by_drf(data)
            if value is not _MISSING:
                out[name] = value
        return out

    return validate
