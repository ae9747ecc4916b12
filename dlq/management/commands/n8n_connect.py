"""``manage.py n8n_connect``: a tenant's n8n connection for lead capture (DESIGN §7).

The n8n API key is read from standard input (a prompt without echo on a terminal), never
from the command line, where the process list and shell history would keep it; it is stored
encrypted and never printed.
"""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlq.n8n import connections as dlq_connections
from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.tenants.config_changes import cli_actor


class Command(BaseCommand):
    help = (
        "Connect a tenant's n8n instance (its URL, and its API key read from standard input) so that n8n Error"
        " Trigger entries get the failed node's input items as their payload."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--url", help="the n8n instance's address, e.g. https://n8n.example.com")
        parser.add_argument("--timeout-seconds", type=float, help="for one request to n8n (0.5–30, default 5)")
        parser.add_argument(
            "--keep-key", action="store_true", help="keep the stored API key (change only the URL or the timeout)"
        )
        switch = parser.add_mutually_exclusive_group()
        switch.add_argument("--off", action="store_true", help="keep the connection but stop fetching")
        switch.add_argument("--on", action="store_true", help="fetch again after --off")
        parser.add_argument("--disconnect", action="store_true", help="remove the connection and its key")

    def _read_key(self) -> str:
        if sys.stdin.isatty():
            key = getpass.getpass("n8n API key (not echoed): ")
        else:
            key = sys.stdin.readline()
        key = key.strip()
        if not key:
            raise CommandError("No n8n API key on standard input (or give --keep-key).")
        return key

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"No tenant {options['tenant']!r}.")
        if options["disconnect"]:
            removed = dlq_connections.n8n_connection_delete(tenant=tenant, actor=cli_actor())
            self.stdout.write(f"n8n connection of {tenant.slug} " + ("removed" if removed else "did not exist"))
            return
        if not options["url"]:
            raise CommandError("--url is required (or --disconnect).")
        api_key = None if options["keep_key"] else self._read_key()
        active = True if options["on"] else (False if options["off"] else None)
        try:
            connection = dlq_connections.n8n_connection_save(
                tenant=tenant,
                base_url=options["url"],
                api_key=api_key,
                timeout_seconds=options["timeout_seconds"],
                active=active,
                actor=cli_actor(),
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        state = "on" if connection.active else "off"
        key = "replaced" if api_key else "kept"
        self.stdout.write(
            f"n8n connection of {tenant.slug} -> {connection.base_url} ({state}; API key {key}, stored encrypted)"
        )
