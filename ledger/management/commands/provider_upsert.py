from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import ASYNC_ADAPTER_FIELDS, IdempotencyClass, Tenant
from ledger.platform.errors import DomainError
from ledger.protocol import services
from ledger.rules.provider_checks import secret_env_names
from ledger.tenants.config_changes import cli_actor


def json_file(path: str) -> Any:
    """The JSON document in ``path`` (None for an empty file)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise CommandError(f"Cannot read {path}: {exc.strerror}.") from None
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{path} is not JSON: {exc}.") from None


class Command(BaseCommand):
    help = (
        "Create or update a provider (a receiver of side effects) for a tenant. Rate and concurrency caps"
        " (--max-in-flight, --rate-limit per --rate-period-seconds, --rate-burst) hold across every worker"
        " process, counted in the database; a 429 halves the effective rate and in-flight limit, which climb"
        " back while quiet."
    )

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
        parser.add_argument(
            "--recheck-after",
            type=int,
            help="seconds: an older retry first asks the tenant's eligibility webhook whether it is still wanted",
        )
        parser.add_argument(
            "--max-in-flight",
            type=int,
            help="most calls to this provider at once, over every worker process (0 = no cap)",
        )
        parser.add_argument(
            "--rate-limit",
            type=int,
            help="most calls per --rate-period-seconds, over every worker process (0 = no rate); a 429 lowers"
            " the effective rate (halved), which climbs back while the provider stays quiet",
        )
        parser.add_argument(
            "--rate-period-seconds",
            type=int,
            help="the period of --rate-limit: 1 = per second (default), 60 = per minute",
        )
        parser.add_argument(
            "--rate-burst", type=int, help="calls that may go at once after a quiet spell (default 1: evenly spaced)"
        )
        parser.add_argument(
            "--concurrency-recovery-seconds",
            type=int,
            help="after a 429 halves the in-flight limit, seconds without one per +1 (0 = the deployment's default)",
        )
        parser.add_argument("--unit-price")
        parser.add_argument("--auth-header", help="the header the credential is sent in, e.g. Authorization")
        parser.add_argument(
            "--auth-secret-env",
            help="read the credential from this environment variable: one of the tenant's declared variables,"
            " ONCEGUARD_SECRET_<the tenant's secret namespace>_<NAME> (tenant_create prints the namespace; an"
            " error names the tenant's)",
        )
        parser.add_argument(
            "--auth-secret-stdin",
            action="store_true",
            help="store the credential read from standard input, encrypted (never printed, never in argv)",
        )
        parser.add_argument("--clear-auth-secret", action="store_true", help="forget the stored credential")
        parser.add_argument(
            "--canary-percent",
            type=int,
            help="roll a change of the adapter fields out as a canary taking this share (1–100) of new operations;"
            " without it the new adapter revision is stable at once",
        )
        parser.add_argument(
            "--intent-schema-file",
            help='a JSON file with the intent schema submissions are checked against ({"fields": {…}}; an empty'
            " file clears it)",
        )
        parser.add_argument(
            "--request-template-file",
            help="a JSON file with the request template translating an intent into the provider's request",
        )
        parser.add_argument(
            "--async-file",
            help="a JSON file with the asynchronous adapter fields (poll_path, poll_status_pointer,"
            " poll_succeeded_values, …, output_height_pointer: DESIGN §5, asynchronous providers)",
        )
        parser.add_argument(
            "--webhook-secret-stdin",
            action="store_true",
            help="store the key the provider signs its webhooks with, read from standard input, encrypted",
        )
        parser.add_argument("--clear-webhook-secret", action="store_true", help="forget the stored webhook secret")
        parser.add_argument("--reason", default="", help="why: recorded with the adapter revision and the change")
        parser.add_argument(
            "--resend-approval-required",
            choices=("on", "off"),
            help="four-eyes: re-sends of this provider's failures wait for a second person's approval (ADR 0013)",
        )

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
            "recheck_after",
            "rate_period_seconds",
            "rate_burst",
            "unit_price",
            "auth_header",
            "auth_secret_env",
        ):
            if options.get(name) is not None:
                fields[name] = options[name]
        for name in ("max_in_flight", "rate_limit", "concurrency_recovery_seconds"):
            if options.get(name) is not None:
                # 0 lifts the cap (an empty value in the console).
                fields[name] = options[name] or None
        if options.get("success_values") is not None:
            fields["success_values"] = [v.strip() for v in options["success_values"].split(",") if v.strip()]
        for name in ("intent_schema", "request_template"):
            path = options.get(f"{name}_file")
            if path is not None:
                fields[name] = json_file(path)
        if options.get("async_file") is not None:
            declared = json_file(options["async_file"]) or {}
            unknown = set(declared) - set(ASYNC_ADAPTER_FIELDS) if isinstance(declared, dict) else {"(not an object)"}
            if unknown:
                raise CommandError(f"--async-file: not asynchronous adapter fields: {', '.join(sorted(unknown))}")
            fields.update(declared)
        if options["webhook_secret_stdin"] and (options["auth_secret_stdin"] or options["clear_webhook_secret"]):
            raise CommandError("--webhook-secret-stdin reads standard input alone: set the credential in another run.")
        webhook_secret: str | None = None
        if options["webhook_secret_stdin"]:
            webhook_secret = sys.stdin.readline().rstrip("\r\n")
            if not webhook_secret:
                raise CommandError("No webhook secret on standard input.")
        elif options["clear_webhook_secret"]:
            webhook_secret = ""
        if options["auth_secret_stdin"] and options["clear_auth_secret"]:
            raise CommandError("Give --auth-secret-stdin or --clear-auth-secret, not both.")
        if options["auth_secret_stdin"]:
            secret = sys.stdin.readline().rstrip("\r\n")
            if not secret:
                raise CommandError("No credential on standard input.")
            fields["auth_secret"] = secret
        elif options["clear_auth_secret"]:
            fields["auth_secret"] = ""
        if options["resend_approval_required"]:
            fields["resend_approval_required"] = options["resend_approval_required"] == "on"
        try:
            provider = services.provider_upsert(
                tenant=tenant,
                slug=options["slug"],
                actor=cli_actor(),
                # The command line is the platform's: it may set the platform-owned fields.
                platform=True,
                reason=options["reason"],
                canary_percent=options["canary_percent"],
                webhook_secret=webhook_secret,
                **fields,
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(
            f"provider {tenant.slug}/{provider.slug} ({provider.idempotency_class}) -> {provider.base_url}"
        )
        if provider.auth_secret_env:
            self.stdout.write(
                f"credential from {provider.auth_secret_env} (tenant's variables: {secret_env_names(tenant.secret_namespace)})"
            )
