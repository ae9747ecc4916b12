from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from relay.management.commands._serve import check_host, serve_until_stopped
from relay.mock_providers import MODES, make_mock_provider


class Command(BaseCommand):
    help = (
        "Run a mock provider (a real HTTP server with a countable effect at POST /charges and /contacts): "
        "'enforced' dedups on the idempotency header like Stripe, 'advisory' counts every request."
    )
    # No database, no checks: it must start fast and anywhere (tests, users' CI).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8010, help="0 picks a free port (printed on start)")
        parser.add_argument("--mode", choices=MODES, required=True)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--header", default="Idempotency-Key", help="the idempotency header")
        parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")

    def handle(self, *args: Any, **options: Any) -> None:
        check_host(options["host"], options["allow_remote"])
        try:
            server = make_mock_provider(
                options["mode"], host=options["host"], port=options["port"], header=options["header"]
            )
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc.strerror}") from exc
        serve_until_stopped(server, self.stdout, f"mock provider ({options['mode']})")
