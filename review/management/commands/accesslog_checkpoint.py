from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from review.audit.accesslog import accesslog_checkpoint, accesslog_checkpoint_all


class Command(BaseCommand):
    help = (
        "Sign every tenant's access-log head now (the django-q2 schedule does the same every"
        " ONCEGUARD_ACCESS_LOG['CHECKPOINT_MINUTES']); --force writes one even when nothing moved."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", type=int, help="tenant id; default all")
        parser.add_argument("--force", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["tenant"] is not None:
            written = int(accesslog_checkpoint(tenant_id=options["tenant"], force=options["force"]) is not None)
        else:
            written = accesslog_checkpoint_all(force=options["force"])
        self.stdout.write(f"{written} checkpoint(s) written")
