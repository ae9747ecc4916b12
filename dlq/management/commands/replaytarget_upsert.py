from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlq import services
from ledger.config_changes import cli_actor
from ledger.errors import DomainError
from ledger.models import Tenant


class Command(BaseCommand):
    help = "Create or update a replay target (where DLQ replays are sent) for a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--slug", required=True)
        parser.add_argument("--url", required=True)
        parser.add_argument("--idempotency-header", help="header carrying the original key (default Idempotency-Key)")
        parser.add_argument("--timeout-seconds", type=float)
        parser.add_argument("--default", action="store_true", help="make it the tenant's default target")
        parser.add_argument(
            "--auto-replay", action="store_true", default=None, help="let the schedule replay transient failures"
        )
        parser.add_argument("--no-auto-replay", dest="auto_replay", action="store_false")
        parser.add_argument("--inactive", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        # The URL must pass the outbound policy (ledger.outbound): refused with the reason.
        try:
            target = services.replay_target_upsert(
                tenant=tenant,
                slug=options["slug"],
                url=options["url"],
                idempotency_header=options.get("idempotency_header"),
                timeout_seconds=options.get("timeout_seconds"),
                is_default=True if options["default"] else None,
                auto_replay=options.get("auto_replay"),
                active=False if options["inactive"] else None,
                actor=cli_actor(),
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        flags = [f for f, on in (("default", target.is_default), ("auto-replay", target.auto_replay)) if on]
        self.stdout.write(
            f"replay target {tenant.slug}/{target.slug} -> {target.url}"
            f" (header {target.idempotency_header}{', ' + ', '.join(flags) if flags else ''})"
        )
