"""Fill the work queue's mirror (``ledger_open_operation``, ADR 0017) for operations that were
open before its triggers existed, or repair it: migration 0042 runs the same batches itself.
Safe while the service runs: each batch of ids is its own short transaction under
``lock_timeout``; it prints its watermark after each, so an interrupted run resumes with
``--from-id``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ledger.store import open_rows


class Command(BaseCommand):
    help = (
        "Copy every open operation row into the work queue's mirror, in batches of ids (each its own"
        " transaction, lock-bounded), and drop mirrors of finished rows. Idempotent; resumable from an id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from-id", type=int, default=0, help="Resume after this operation id (a watermark).")
        parser.add_argument("--span", type=int, default=10_000, help="Ids per batch (one transaction each).")
        parser.add_argument(
            "--lock-timeout-ms", type=int, default=2000, help="How long a batch waits for a row lock before retrying."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def progress(upto: int, copied: int) -> None:
            self.stdout.write(f"watermark {upto}: {copied} open rows copied so far")

        copied = open_rows.open_rows_backfill(
            start_after=options["from_id"],
            span=max(1, options["span"]),
            lock_timeout_ms=options["lock_timeout_ms"],
            progress=progress,
        )
        self.stdout.write(f"done: {copied} open rows copied")
