from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import services
from ledger.errors import DomainError
from ledger.models import Tenant


class Command(BaseCommand):
    help = "Create an API key for a tenant. The key is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--scopes", default="read,write", help="comma-separated: read,write,admin")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        scopes = [s.strip() for s in options["scopes"].split(",") if s.strip()]
        try:
            api_key, secret = services.apikey_create(tenant=tenant, scopes=scopes, name=options["name"])
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"API key {api_key.prefix} for tenant {tenant.slug}, scopes {','.join(scopes)} (shown once):")
        self.stdout.write(secret)
