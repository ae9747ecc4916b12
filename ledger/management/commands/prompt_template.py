from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import PromptTemplate, Tenant
from ledger.platform.errors import DomainError
from ledger.providers import prompts
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = (
        "Prompt templates (versioned, immutable): `create` the next version of a name from a text file with"
        " its slots, or `list` a tenant's versions."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create", "list"])
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--name", help="the prompt's name (create; optional filter for list)")
        parser.add_argument("--text-file", help="the prompt's text, with {{ slot }} for each slot (create)")
        parser.add_argument(
            "--slot",
            action="append",
            default=[],
            metavar="NAME=MAX_LENGTH",
            help="a slot the user's text goes into, with its length cap (repeat for each)",
        )
        parser.add_argument("--reason", default="", help="why: recorded in the configuration trail")
        parser.add_argument(
            "--manifest-schema-file",
            help="a JSON Schema the evaluation manifests of jobs pinned to this version must match (create)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        if options["action"] == "list":
            rows = PromptTemplate.objects.filter(tenant_id=tenant.pk).order_by("name", "version")
            if options["name"]:
                rows = rows.filter(name=options["name"])
            for row in rows:
                slots = ", ".join(f"{n}≤{s['max_length']}" for n, s in row.slots.items())
                self.stdout.write(f"{row} slots: {slots or '-'} by {row.created_by} at {row.created_at:%Y-%m-%d %H:%M}")
            return
        if not options["name"] or not options["text_file"]:
            raise CommandError("create needs --name and --text-file.")
        try:
            with open(options["text_file"], encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise CommandError(f"Cannot read {options['text_file']}: {exc.strerror}.") from None
        manifest_schema = None
        if options["manifest_schema_file"]:
            try:
                with open(options["manifest_schema_file"], encoding="utf-8") as fh:
                    manifest_schema = json.load(fh)
            except (OSError, ValueError) as exc:
                raise CommandError(f"Cannot read {options['manifest_schema_file']} as JSON: {exc}.") from None
        slots: dict[str, Any] = {}
        for spec in options["slot"]:
            name, sep, cap = spec.partition("=")
            if not sep or not cap.isdigit():
                raise CommandError(f"--slot {spec!r}: write NAME=MAX_LENGTH, e.g. description=500.")
            slots[name] = {"max_length": int(cap)}
        try:
            prompt = prompts.prompt_template_create(
                tenant=tenant,
                name=options["name"],
                text=text,
                slots=slots,
                actor=cli_actor(),
                reason=options["reason"],
                manifest_schema=manifest_schema,
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"prompt template {tenant.slug}/{prompt}")
