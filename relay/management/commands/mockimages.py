from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from relay.management.commands._serve import check_host, serve_until_stopped
from relay.mock_images import make_mock_image_provider


class Command(BaseCommand):
    help = (
        "Run the mock image API (asynchronous, key-enforced): POST /v1/renders → job id, GET /v1/renders/{id} "
        "→ status, GET /v1/renders/{id}/output → a PNG; switches for slow, failing, wrong-size, wrong-type jobs."
    )
    # No database, no checks: it must start fast and anywhere (tests, users' CI).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8014, help="0 picks a free port (printed on start)")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")

    def handle(self, *args: Any, **options: Any) -> None:
        check_host(options["host"], options["allow_remote"])
        try:
            server = make_mock_image_provider(host=options["host"], port=options["port"])
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc.strerror}") from exc
        serve_until_stopped(server, self.stdout, "mock image provider")
