"""``manage.py provider_revision``: a provider's adapter revisions, and the rollout moves an
operator makes by hand (ledger.providers.canary), recorded with the operating-system account as actor."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import Provider, ProviderKind
from ledger.platform.errors import DomainError
from ledger.providers import canary
from ledger.recovery import recall
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = (
        "Show a provider's adapter revisions (list), run one as a canary for a share of new operations"
        " (canary), roll forward (promote) or roll back (rollback)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=("list", "canary", "promote", "rollback"))
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--slug", required=True)
        parser.add_argument(
            "--number",
            type=int,
            help="canary: the revision (required); promote: default the canary; rollback: without a canary"
            " running, the revision to return to (required), with one leave it out",
        )
        parser.add_argument("--percent", type=int, help="canary: share of new operations, 1–100")
        parser.add_argument("--reason", default="", help="why (required for every move; recorded)")
        parser.add_argument("--json", action="store_true", help="list: print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        provider = Provider.objects.filter(
            tenant__slug=options["tenant"], slug=options["slug"], kind=ProviderKind.HTTP
        ).first()
        if provider is None:
            raise CommandError(f"No provider {options['tenant']}/{options['slug']}.")
        action = options["action"]
        try:
            if action == "canary":
                if options["number"] is None or options["percent"] is None:
                    raise CommandError("canary needs --number and --percent.")
                provider = canary.canary_start(
                    provider_id=provider.pk,
                    number=options["number"],
                    percent=options["percent"],
                    actor=cli_actor(),
                    reason=options["reason"],
                )
            elif action == "promote":
                provider = canary.revision_promote(
                    provider_id=provider.pk, number=options["number"], actor=cli_actor(), reason=options["reason"]
                )
            elif action == "rollback":
                # Its outputs are recalled too (ADR 0020).
                result, recalled = recall.revision_rollback_recall(
                    provider_id=provider.pk, number=options["number"], actor=cli_actor(), reason=options["reason"]
                )
                provider = result.provider
                self.stdout.write(
                    f"rolled back revision {result.rolled_back}; stable is revision {result.stable};"
                    f" {result.requeued} operation(s) re-queued under it; outputs recalled:"
                    f" {recalled['quarantined']} quarantined, {recalled['flagged']} flagged"
                )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        rollout = canary.provider_rollout(provider)
        if options["json"]:
            self.stdout.write(json.dumps(rollout, default=str, indent=2, sort_keys=True))
            return
        canary_text = (
            f"; canary revision {rollout['canary_revision']} at {rollout['canary_percent']} %"
            if rollout["canary_revision"]
            else "; no canary"
        )
        self.stdout.write(
            f"{options['tenant']}/{provider.slug}: stable revision {rollout['stable_revision']}{canary_text}"
        )
        if rollout["watch"]:
            watch = rollout["watch"]
            self.stdout.write(
                f"  watch: {watch['verdict']} — canary {watch['canary_failures']}/{watch['canary_attempts']},"
                f" stable {watch['stable_failures']}/{watch['stable_attempts']} since {watch['since']}"
            )
        if action == "list":
            for revision in rollout["revisions"]:
                self.stdout.write(
                    f"  {revision['number']:>4} {revision['role']:<8} {revision['created_at']:%Y-%m-%d %H:%M}"
                    f" {revision['created_by']}: {revision['reason']}"
                )
