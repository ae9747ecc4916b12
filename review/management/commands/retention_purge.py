from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from review.retention.purge import retention_purge


class Command(BaseCommand):
    help = "Run one retention pass now (the django-q2 schedule runs the same every hour)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--max-batches", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        runs = retention_purge(batch_size=options["batch_size"], max_batches=options["max_batches"], trigger="manual")
        for run in runs:
            self.stdout.write(
                f"tenant {run.tenant_id}: {run.status} redacted={run.redacted} deleted={run.deleted}"
                f" discarded={run.discarded} tombstones +{run.tombstones_created}/-{run.tombstones_expired}"
                f" batches={run.batches}"
            )
        if not runs:
            self.stdout.write("no tenant has a retention policy")
