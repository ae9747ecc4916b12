from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from review.privacy import accesslog_verify


class Command(BaseCommand):
    help = "Recompute the access log's hash chains (per tenant, from the purge anchors); exit 1 if any is broken."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", type=int, help="tenant id (repeatable); default all")

    def handle(self, *args: Any, **options: Any) -> None:
        checked, problems = accesslog_verify(tenant_ids=options["tenant"])
        for p in problems:
            self.stderr.write(f"tenant {p.tenant_id} seq {p.seq}: {p.problem}")
        if problems:
            raise CommandError(f"access log chain BROKEN: {len(problems)} problem(s) in {checked} rows")
        self.stdout.write(self.style.SUCCESS(f"access log chain intact: {checked} rows verified"))
