"""Plaintext search over payloads, limited to configured non-personal paths (DESIGN §6).

The ledger (operations) and the DLQ (failed events) both keep a `search_fields` JSON
column: {dotted path: value as text} for the configured paths only, written with the
payload. Filters are `path:value` pairs; PostgreSQL answers them with `@>` on a GIN index.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

from ledger.platform.errors import ValidationFailed

MAX_SEARCH_VALUE = 200
M = TypeVar("M", bound=Model)


@functools.lru_cache(maxsize=32)
def _split_paths(paths: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((path, tuple(path.split("."))) for path in paths)


def search_values(payload: Any, paths: list[str]) -> dict[str, str]:
    """The configured (non-personal) paths' scalar values, as strings, for filtering."""
    found: dict[str, str] = {}
    if not isinstance(payload, dict):
        return found
    for path, parts in _split_paths(tuple(paths)):
        node: Any = payload
        for part in parts:
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                node = None
                break
        if isinstance(node, bool):
            found[path] = "true" if node else "false"
        elif isinstance(node, (str, int, float)):
            found[path] = str(node)[:MAX_SEARCH_VALUE]
    return found


def parse_match(values: list[str], allowed: list[str]) -> dict[str, str]:
    """``path:value`` (or ``path=value``) pairs on the configured searchable paths."""
    match: dict[str, str] = {}
    for raw in values:
        sep = ":" if ":" in raw else "="
        path, found, value = raw.partition(sep)
        path = path.strip()
        if not found or not path:
            raise ValidationFailed("match must look like path:value, e.g. workflow.id:17.")
        if path not in allowed:
            raise ValidationFailed(f"{path!r} is not a searchable path; configured: {', '.join(sorted(allowed))}.")
        match[path] = value.strip()
    return match


def filter_match(qs: QuerySet[M], match: dict[str, str]) -> QuerySet[M]:
    if not match:
        return qs
    if connection.vendor == "postgresql":
        # jsonb @> — served by the GIN index on search_fields (jsonb_path_ops).
        return qs.filter(search_fields__contains=match)
    # SQLite has no JSON containment: one key lookup per path (keys are flat dotted strings).
    for path, value in match.items():
        qs = qs.filter(**{f"search_fields__{path}": value})
    return qs
