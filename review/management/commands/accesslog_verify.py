from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from review.audit.accesslog import accesslog_verify
from review.audit.accesslog_witness import accesslog_verify_witnessed


class Command(BaseCommand):
    help = (
        "Recompute the access log's keyed chains (per tenant, from their signed purge anchors) and check"
        " them against the signed checkpoints: edited, forged, missing or truncated rows, deleted or forged"
        " checkpoints, checkpoints that stopped. With --log, also check every row witnessed in the log"
        " stream (accesslog_witness lines) is still in the database with the same hash: rows deleted"
        " since the last checkpoint. Exits 1 on any break (for monitoring)."
    )
    # call_command(..., stdin=...) for `--log -` (as createsuperuser does).
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", action="append", type=int, help="tenant id (repeatable); default all")
        parser.add_argument(
            "--log",
            action="append",
            metavar="FILE",
            help="a log file holding the service's structured log lines, JSON or key=value (repeatable; - reads"
            " standard input)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checked, problems = accesslog_verify(tenant_ids=options["tenant"])
        witnessed = ""
        log_problems: list[str] = []
        if options["log"]:
            report = accesslog_verify_witnessed(
                logs=options["log"], tenant_ids=options["tenant"], stdin=options.get("stdin")
            )
            problems += report.problems
            log_problems = report.log_problems
            witnessed = f"; {report.checked} witnessed rows checked against {', '.join(options['log'])}"
        for p in problems:
            where = f"seq {p.seq}" if p.seq is not None else "chain"
            self.stderr.write(f"tenant {p.tenant_id} {where}: {p.problem}")
        for text in log_problems:
            self.stderr.write(f"log: {text}")
        if problems or log_problems:
            raise CommandError(
                f"access log chain BROKEN: {len(problems) + len(log_problems)} problem(s) in {checked} rows{witnessed}"
            )
        self.stdout.write(self.style.SUCCESS(f"access log chain intact: {checked} rows verified{witnessed}"))
