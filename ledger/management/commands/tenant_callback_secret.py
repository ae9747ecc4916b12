from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.callbacks import tenant_callback_secret
from ledger.config_changes import cli_actor
from ledger.models import Tenant
from ledger.services import tenant_update


class Command(BaseCommand):
    help = (
        "Print a tenant's callback signing secret (created on first use); --rotate replaces it."
        " Receivers check the Onceguard-Signature header: t=<unix>,v1=<hex HMAC-SHA256(secret, '<t>.' + body)>."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--rotate", action="store_true")
        parser.add_argument("--allow", action="append", default=[], help="add a URL prefix to the allow-list")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        allow_list = list(tenant.callback_allow_list)
        for prefix in options["allow"]:
            if not prefix.startswith(("https://", "http://")):
                raise CommandError("Allow-list entries are http(s) URL prefixes.")
            if prefix not in allow_list:
                allow_list.append(prefix)
        if allow_list != tenant.callback_allow_list:
            tenant = tenant_update(tenant_id=tenant.pk, actor=cli_actor(), callback_allow_list=allow_list)
        secret = tenant_callback_secret(tenant_id=tenant.pk, rotate=options["rotate"], actor=cli_actor())
        self.stdout.write(f"callback secret for {tenant.slug}: {secret}")
        self.stdout.write(f"callback allow-list: {', '.join(tenant.callback_allow_list) or '(empty)'}")
