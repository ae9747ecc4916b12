"""Fill the search rows of operations written before them (ADR 0018), live: batches by id
range, each a short transaction with a lock timeout; resumable (``--after``) and idempotent.
Once a pass reaches the last id, the operation row's old search indexes are dropped
``CONCURRENTLY`` (``--keep-old-indexes`` leaves them)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ledger.store.search_rows import old_search_indexes_drop, search_rows_backfill


class Command(BaseCommand):
    help = "Fill ledger_operation_search for existing operations, batch by batch, while the service runs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--after", type=int, default=0, help="resume above this operation id")
        parser.add_argument("--batch", type=int, default=5_000, help="operation ids per transaction")
        parser.add_argument("--lock-timeout-ms", type=int, default=2_000)
        parser.add_argument("--keep-old-indexes", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        written = 0
        for step in search_rows_backfill(
            after=options["after"], batch=options["batch"], lock_timeout_ms=options["lock_timeout_ms"]
        ):
            written += step.written
            # The resume point, after every committed batch.
            self.stdout.write(
                f"ids up to {step.upto} of {step.last_id}: {step.written} rows (resume: --after {step.upto})"
            )
        self.stdout.write(f"done: {written} rows written")
        if not options["keep_old_indexes"]:
            for name in old_search_indexes_drop():
                self.stdout.write(f"dropped index {name}")
