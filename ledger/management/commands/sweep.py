from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ledger.sweeper import sweep


class Command(BaseCommand):
    help = "Run one sweeper pass (every rule it can apply) and print what it did."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=500)

    def handle(self, *args: Any, **options: Any) -> None:
        report = sweep(batch=options["batch"])
        if not report.counts:
            self.stdout.write("nothing to do")
        for name, n in sorted(report.counts.items()):
            self.stdout.write(f"{name}: {n}")
