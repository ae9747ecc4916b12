from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.protocol import services
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = "Create an API key for a tenant. The key is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument(
            "--scopes",
            default="read,write",
            help="comma-separated: read,write,admin,payload,audit (payload: reveals; audit: data-subject trails)",
        )
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--expires-in-days", type=float, default=None, help="the key stops working after this many days"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        days = options["expires_in_days"]
        if days is not None and not 0 < days <= 36500:
            raise CommandError("--expires-in-days must be a number of days above 0 (at most 36500).")
        expires_at = timezone.now() + timedelta(days=days) if days is not None else None
        try:
            api_key, secret = services.apikey_create(
                tenant=tenant, scopes=scopes, name=options["name"], expires_at=expires_at, actor=cli_actor()
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        expiry = f", expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
        self.stdout.write(
            f"API key {api_key.prefix} for tenant {tenant.slug}, scopes {','.join(scopes)}{expiry} (shown once):"
        )
        self.stdout.write(secret)
