"""DRF serializers built once per thread and reused: the API's one speed-up off DRF's usual path.

DRF's usual path builds a serializer per request, and building one deep-copies every
declared field: ~85 % of the CPU a serializer costs. A claim's input serializer costs
~250 µs that way and ~35 µs reused; an operation's output serializer ~335 µs and ~45 µs.
Over HTTP that was worth +30–40 % fresh claim→complete ops/s (median of 7 interleaved
rounds, `python -m bench.compare`; docs/explanation/benchmarks.md), above the 10 % bar a shortcut must
clear to stay.

Nothing is re-implemented: ``validated_data`` runs the serializer's own
``run_validation`` (every field's own ``run_validation``, validators, ``validate_<name>``
and ``validate``) and ``represented`` its own ``to_representation``, exactly what
``is_valid()`` and ``.data`` run, on field instances built once per thread instead of per
call; a body it refuses is validated again by a fresh serializer, so every 400 carries
``is_valid()``'s own errors. tests/test_serializer_reuse.py holds that both answer exactly like a fresh serializer.

Only for serializers that read nothing of the serializer instance beyond its fields (no
``self.instance``, ``self.initial_data``, ``self.context`` or ``partial``): every input and
output serializer of the API is such.
"""

from __future__ import annotations

import threading
from typing import Any

from rest_framework import serializers
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
    try:
        return dict(prototype(serializer_class).run_validation(data))
    except ValidationError:
        pass
    # A refusal is answered by a serializer built for it: word for word is_valid()'s errors
    # (which reshape a few, e.g. a missing body), and refusals are not the hot path.
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def represented(serializer_class: type[serializers.Serializer], instance: Any) -> dict[str, Any]:
    """``serializer_class(instance).data`` as a plain dict (same keys, order and values)."""
    return prototype(serializer_class).to_representation(instance)
