"""Read the ledger's view of restore fencing now (ADR 0012): what a process does at its start.
Run it after restoring the database, before opening the service to traffic."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ledger.protocol import fencing


class Command(BaseCommand):
    help = (
        "Compare the database's epoch with the fence journal's, hold the journaled keys the database"
        " does not know (a restored backup), advance the epoch, and print what it found. Exit status 3"
        " when holds are open (the console's Restore holds page lists them)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not fencing.fencing_enabled():
            raise CommandError("Restore fencing is off (FENCE_JOURNAL=off).")
        report = fencing.view_load(at_start=True)
        open_count = fencing.open_holds().count()
        went = "went back in time (restored)" if report.went_back else "in step with its journal"
        self.stdout.write(
            f"database epoch {report.database_epoch}, journal epoch {report.journal_epoch}: {went}; "
            f"new holds {report.new_holds}, open holds {open_count}; epoch now {report.epoch}"
        )
        if open_count:
            raise SystemExit(3)
