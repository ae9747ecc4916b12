from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.protocol.callbacks import callback_secret_summary, tenant_callback_secret
from ledger.protocol.services import tenant_update
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = (
        "Make a tenant's callback signing secret and print it once; --rotate makes a new one (printed once; the"
        " previous one keeps signing for CALLBACK_SECRET_OVERLAP_SECONDS). A secret that exists is never printed"
        " again. Receivers check the Onceguard-Signature header: t=<unix>,v1=<hex HMAC-SHA256(secret, '<t>.' +"
        " body)>, one v1 per valid secret; accept when any matches."
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
            if prefix not in allow_list:
                allow_list.append(prefix)
        if allow_list != tenant.callback_allow_list:
            # Each entry passes the outbound policy and is stored in canonical form (Tenant.clean).
            try:
                tenant = tenant_update(tenant_id=tenant.pk, actor=cli_actor(), callback_allow_list=allow_list)
            except DomainError as exc:
                raise CommandError(exc.detail) from None
        if options["rotate"] or not tenant.callback_secret:
            secret = tenant_callback_secret(tenant_id=tenant.pk, rotate=options["rotate"], actor=cli_actor())
            self.stdout.write(f"callback secret for {tenant.slug} (shown this once): {secret}")
        else:
            tenant.refresh_from_db()
            self.stdout.write(
                f"callback secret for {tenant.slug}: {callback_secret_summary(tenant)}; --rotate for a new one"
            )
        self.stdout.write(f"callback allow-list: {', '.join(tenant.callback_allow_list) or '(empty)'}")
