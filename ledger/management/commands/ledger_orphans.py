"""Report rows whose tenant, provider or operation is gone (ADR 0019): the references the
database no longer checks at every claim. The same check runs nightly (``ledger.orphans``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ledger.store.orphans import orphans_count


class Command(BaseCommand):
    help = (
        "Count the operations whose tenant or provider is gone and the search rows whose operation is;"
        " exit status 3 when any is found."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        found = orphans_count()
        for reference, count in found.items():
            self.stdout.write(f"{reference}: {count} orphaned")
        if any(found.values()):
            raise SystemExit(3)
