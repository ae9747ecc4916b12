from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from review.accesslog import accesslog_verify


class Command(BaseCommand):
    help = (
        "Recompute the access log's keyed chains (per tenant, from their signed purge anchors) and check"
        " them against the signed checkpoints: edited, forged, missing or truncated rows, deleted or forged"
        " checkpoints, checkpoints that stopped. Exits 1 on any break (for monitoring)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", type=int, help="tenant id (repeatable); default all")

    def handle(self, *args: Any, **options: Any) -> None:
        checked, problems = accesslog_verify(tenant_ids=options["tenant"])
        for p in problems:
            where = f"seq {p.seq}" if p.seq is not None else "chain"
            self.stderr.write(f"tenant {p.tenant_id} {where}: {p.problem}")
        if problems:
            raise CommandError(f"access log chain BROKEN: {len(problems)} problem(s) in {checked} rows")
        self.stdout.write(self.style.SUCCESS(f"access log chain intact: {checked} rows verified"))
