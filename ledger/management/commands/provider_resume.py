from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import Provider
from ledger.protocol.services import provider_resume


class Command(BaseCommand):
    help = "Resume a provider paused after a 401/403 (an operator's decision): its queued work flows again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--slug", required=True)
        parser.add_argument("--actor", default="operator:cli")

    def handle(self, *args: Any, **options: Any) -> None:
        provider = Provider.objects.filter(tenant__slug=options["tenant"], slug=options["slug"]).first()
        if provider is None:
            raise CommandError("No such provider.")
        if provider_resume(provider_id=provider.pk, actor=options["actor"]):
            self.stdout.write(f"provider {options['tenant']}/{provider.slug} resumed")
        else:
            self.stdout.write(f"provider {options['tenant']}/{provider.slug} was not paused")
