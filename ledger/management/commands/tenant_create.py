from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.platform.errors import DomainError
from ledger.protocol import services
from ledger.rules.provider_checks import secret_env_names
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument(
            "--secret-namespace",
            default="",
            help="the tenant's secret namespace, fixed from now on: its providers may read credentials only from"
            " ONCEGUARD_SECRET_<NAMESPACE>_<NAME>. Capital letters and digits, no prefix of another tenant's."
            " Default: from the slug (acme → ACME) where free, else the next free one",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = services.tenant_create(
                slug=options["slug"],
                name=options["name"],
                secret_namespace=options["secret_namespace"],
                actor=cli_actor(),
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"created tenant {tenant.slug}")
        self.stdout.write(
            f"secret namespace {tenant.secret_namespace}: its providers may read {secret_env_names(tenant.secret_namespace)}"
        )
