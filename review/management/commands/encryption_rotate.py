from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from review.privacy.keys import encryption_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt stored payloads and responses under the current key (the first of"
        " ONCEGUARD_ENCRYPTION_KEYS) in batches, and re-key the data-subject index. Run after"
        " prepending a new key; drop the old key only once this reports 0 left."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500)
        parser.add_argument("--dry-run", action="store_true", help="only count what is not under the current key")

    def handle(self, *args: Any, **options: Any) -> None:
        report = encryption_rotate(batch_size=options["batch_size"], dry_run=options["dry_run"], out=self.stdout.write)
        for table, counts in report.items():
            self.stdout.write(f"{table}: {counts}")
