from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlq.models import ReplayAck, ReplayTarget
from dlq.targets import services as dlq_targets
from ledger.models import IdempotencyClass, Tenant
from ledger.platform.errors import DomainError
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = (
        "Create or update a replay target (where DLQ replays are sent) for a tenant. A new target needs its"
        " --idempotency-class; its signing secret is printed once, when it is made or rotated."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--slug", required=True)
        parser.add_argument("--url", required=True)
        parser.add_argument(
            "--idempotency-class",
            choices=IdempotencyClass.values,
            help="key_enforced: the receiver refuses a second effect of a key (an ambiguous entry is re-sent);"
            " key_advisory: it may not (an ambiguous entry waits for a person's decision). Required for a new target.",
        )
        parser.add_argument(
            "--ack",
            choices=ReplayAck.values,
            help="echo: a replay counts as delivered only with the receiver's Onceguard-Ack (n8n receivers: the"
            " replay-receiver template sends it); status: a 2xx is enough. Undeclared on a new target: echo on the"
            " tenant's n8n, else status, listed as not confirmed.",
        )
        parser.add_argument("--idempotency-header", help="header carrying the original key (default Idempotency-Key)")
        parser.add_argument("--lookup-url", help="a search by the business key, with {key}, asked before a replay")
        parser.add_argument("--credential-header", help="header the target's credential is sent in ('' removes it)")
        parser.add_argument(
            "--credential-stdin", action="store_true", help="read the credential's value from stdin (stored sealed)"
        )
        parser.add_argument("--rotate-signing-secret", action="store_true", help="make a new signing secret")
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
        exists = ReplayTarget.objects.filter(tenant=tenant, slug=options["slug"]).exists()
        if not exists and not options.get("idempotency_class"):
            raise CommandError(
                "A new replay target needs --idempotency-class key_enforced or key_advisory: does the receiver"
                " refuse a second effect of the same key?"
            )
        credential = sys.stdin.readline().strip() if options["credential_stdin"] else None
        # The URLs must pass the outbound policy (ledger.rules.outbound) and be https unless on this
        # machine: refused with the reason.
        try:
            target = dlq_targets.replay_target_upsert(
                tenant=tenant,
                slug=options["slug"],
                url=options["url"],
                idempotency_class=options.get("idempotency_class"),
                ack=options.get("ack"),
                idempotency_header=options.get("idempotency_header"),
                lookup_url=options.get("lookup_url"),
                credential_header=options.get("credential_header"),
                credential_value=credential,
                timeout_seconds=options.get("timeout_seconds"),
                is_default=True if options["default"] else None,
                auto_replay=options.get("auto_replay"),
                active=False if options["inactive"] else None,
                actor=cli_actor(),
            )
            secret = target.new_signing_secret
            if options["rotate_signing_secret"]:
                secret, _made = dlq_targets.replay_target_signing_secret(
                    target_id=target.pk, rotate=True, actor=cli_actor()
                )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        flags = [f for f, on in (("default", target.is_default), ("auto-replay", target.auto_replay)) if on]
        self.stdout.write(
            f"replay target {tenant.slug}/{target.slug} -> {target.url}"
            f" ({target.get_idempotency_class_display()}, ack {target.ack}"
            f"{'' if target.ack_confirmed else ' (not confirmed)'}, header {target.idempotency_header}"
            f"{', ' + ', '.join(flags) if flags else ''})"
        )
        if secret:
            self.stdout.write(f"signing secret (shown once; receivers verify Onceguard-Signature with it): {secret}")
