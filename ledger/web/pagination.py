"""Cursor pagination whose cursors are checked before they reach a query.

A cursor is client input: base64 of ``o=<offset>&r=<reverse>&p=<position>``, where the
position is the first ordering column's value of the row the page starts after. DRF filters
with that text as is, so a tampered position (a word for an id, a NUL, year 10000 for a
time) fails inside the database driver — a 500. Here every part is read as its column reads
it and range-checked first; anything else is ``400 invalid_cursor``.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Any

from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.paginator import Paginator
from django.db import models
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request

from ledger.platform.errors import InvalidCursor
from ledger.platform.storable import query_time_problem

_MAX_BIGINT = 2**63 - 1


def _position_problem(field: models.Field[Any, Any], position: str) -> str | None:
    if "\x00" in position:
        return "NUL character"
    try:
        value = field.to_python(position)
    except (ValidationError, ValueError, TypeError, OverflowError):
        return "not a value of the ordering column"
    if isinstance(value, datetime):
        if query_time_problem(value) is not None:
            return "time out of range"
    elif isinstance(value, int) and not -_MAX_BIGINT <= value <= _MAX_BIGINT:
        return "integer out of range"
    return None


class KeysetCursorPagination(CursorPagination):
    """DRF's CursorPagination; a cursor it did not write answers 400 ``invalid_cursor``."""

    invalid_cursor_message = "The cursor is not one this list gave out; start again without it."

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            cursor = super().decode_cursor(request)
        except NotFound as exc:
            raise InvalidCursor(self.invalid_cursor_message) from exc
        if cursor is None or cursor.position is None:
            return cursor
        name = self.ordering[0].lstrip("-")
        try:
            field = self._model._meta.get_field(name)
        except FieldDoesNotExist:  # pragma: no cover - orderings name model fields
            raise InvalidCursor(self.invalid_cursor_message) from None
        problem = _position_problem(field, cursor.position)
        if problem is not None:
            raise InvalidCursor(f"{self.invalid_cursor_message} ({problem})")
        return cursor


# Console lists count at most this many rows; past it the page says "more than 10,000".
COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """A console list's paginator that never counts a whole table: COUNT(*) over ten million
    filtered rows is the slow part of a changelist, so it counts at most COUNT_CAP + 1 rows (a
    bounded subquery) and says when there are more (``capped``, shown by the console's
    pagination template); pages beyond the cap need narrower filters."""

    # Set by a list that read all its rows on page one (review.console.listing): nothing to count.
    known_count: int | None = None
    # Set by a list whose rows another, cheaper query names one for one: the ids of its rows,
    # one per row, as a values() query (the work-queue mirror's, or the events' into a
    # terminal state, ADR 0027), counted instead of the rows.
    counted: Any = None
    # Set by a search that stops reading matches after the rows up to its page and one more
    # (SelectorSearchMixin, ADR 0018): a count that reaches it is "more than" that less one.
    read_up_to: int | None = None
    at_least = False

    @cached_property
    def count(self) -> int:
        if self.known_count is not None:
            self.capped = False
            return self.known_count
        # Without ORDER BY: counting needs no order, and any index may serve the filter. Only
        # the primary key: a list's annotations (the operations list's workflow name, a
        # subquery per row) are not computed for rows that are only counted.
        ids = self.object_list.values("pk") if self.counted is None else self.counted
        counted = ids.order_by()[: COUNT_CAP + 1].count()
        self.capped = counted > COUNT_CAP
        self.at_least = not self.capped and self.read_up_to is not None and counted >= self.read_up_to
        return min(counted, COUNT_CAP)
