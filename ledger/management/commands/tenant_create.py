from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import services
from ledger.config_changes import cli_actor
from ledger.errors import DomainError


class Command(BaseCommand):
    help = "Create a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            tenant = services.tenant_create(slug=options["slug"], name=options["name"], actor=cli_actor())
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(f"created tenant {tenant.slug}")
