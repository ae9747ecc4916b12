from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import services
from ledger.config_changes import cli_actor
from ledger.models import IdempotencyClass, Tenant


class Command(BaseCommand):
    help = "Create or update a provider (a receiver of side effects) for a tenant."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--slug", required=True)
        parser.add_argument("--base-url", required=True)
        parser.add_argument("--class", dest="idempotency_class", required=True, choices=IdempotencyClass.values)
        parser.add_argument("--idempotency-header")
        parser.add_argument("--lookup-path", help="may use {key} and {reconciliation_handle}")
        parser.add_argument("--ref-pointer", help="JSON pointer to the provider's reference, e.g. /id")
        parser.add_argument("--status-pointer", help="JSON pointer to the object's status")
        parser.add_argument("--success-values", help="comma-separated status values that mean success")
        parser.add_argument("--lookup-settle-seconds", type=int)
        parser.add_argument("--key-ttl-seconds", type=int)
        parser.add_argument("--timeout-seconds", type=float)
        parser.add_argument("--max-attempts", type=int)
        parser.add_argument("--lifetime-seconds", type=int)
        parser.add_argument("--base-delay-seconds", type=float)
        parser.add_argument("--max-delay-seconds", type=float)
        parser.add_argument("--unit-price")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        fields: dict[str, Any] = {"base_url": options["base_url"], "idempotency_class": options["idempotency_class"]}
        for name in (
            "idempotency_header",
            "lookup_path",
            "ref_pointer",
            "status_pointer",
            "lookup_settle_seconds",
            "key_ttl_seconds",
            "timeout_seconds",
            "max_attempts",
            "lifetime_seconds",
            "base_delay_seconds",
            "max_delay_seconds",
            "unit_price",
        ):
            if options.get(name) is not None:
                fields[name] = options[name]
        if options.get("success_values") is not None:
            fields["success_values"] = [v.strip() for v in options["success_values"].split(",") if v.strip()]
        provider = services.provider_upsert(tenant=tenant, slug=options["slug"], actor=cli_actor(), **fields)
        self.stdout.write(
            f"provider {tenant.slug}/{provider.slug} ({provider.idempotency_class}) -> {provider.base_url}"
        )
