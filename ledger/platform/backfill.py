"""Copying a value into a new column of a large table, a range of ids per transaction.

Used by migrations that add a column to a table that may hold millions of rows (ledger 0029,
dlq 0012, alerts 0004: the tenant copied from each row's parent): no transaction holds more
than one batch's row locks, and rows written meanwhile by a release that does not write the
column yet are caught by a last pass over the ids past the first pass's end.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction


def backfill_in_batches(schema_editor: Any, copies: dict[str, str], batch: int) -> None:
    """Runs each table's statement over ``[start, start + batch)`` id ranges, each in its own
    transaction, until no id is newer than the last range. ``copies`` maps a table to an UPDATE
    taking the range's two bounds as parameters (it should skip rows already copied)."""
    connection = schema_editor.connection
    for table, update in copies.items():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT min(id), max(id) FROM {table}")
            low, high = cursor.fetchone()
        if low is None:
            continue
        start = low
        while True:
            while start <= high:
                with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                    cursor.execute(update, [start, start + batch])
                start += batch
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT max(id) FROM {table}")
                (newest,) = cursor.fetchone()
            if newest <= high:
                break
            high = newest
