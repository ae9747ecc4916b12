from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from alerts import services
from alerts.models import AlertChannelKind
from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = "Create or update an alert channel (Slack, Discord or generic webhook) for a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--kind", required=True, choices=AlertChannelKind.values)
        parser.add_argument("--url", required=True)
        parser.add_argument("--kinds", help="comma-separated alert kinds (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        kinds = [k.strip() for k in options["kinds"].split(",") if k.strip()] if options.get("kinds") else None
        # The URL must pass the outbound policy (ledger.rules.outbound): refused with the reason.
        try:
            channel = services.alert_channel_upsert(
                tenant=tenant,
                name=options["name"],
                kind=options["kind"],
                url=options["url"],
                kinds=kinds,
                actor=cli_actor(),
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"alert channel {tenant.slug}/{channel.name} ({channel.kind})")
