from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.platform import env
from relay.fault_relay import MODES, RelayConfigError, make_relay
from relay.management.commands._serve import check_host, serve_until_stopped


class Command(BaseCommand):
    help = (
        "Run the fault-injection relay in front of a provider. Per request mode from the X-Relay-Mode header, "
        "else the relay's script, else --mode / RELAY_MODE: " + ", ".join(MODES)
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8020, help="0 picks a free port (printed on start)")
        parser.add_argument("--upstream", required=True, help="the provider's base URL")
        parser.add_argument("--mode", choices=MODES, default=env.read("RELAY_MODE"))
        parser.add_argument("--delay", type=float, default=env.read("RELAY_DELAY"))
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--header", default="Idempotency-Key", help="the idempotency header to journal")
        parser.add_argument("--upstream-timeout", type=float, default=30.0)
        parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")

    def handle(self, *args: Any, **options: Any) -> None:
        check_host(options["host"], options["allow_remote"])
        try:
            server = make_relay(
                options["upstream"],
                mode=options["mode"],
                delay=options["delay"],
                host=options["host"],
                port=options["port"],
                header=options["header"],
                upstream_timeout=options["upstream_timeout"],
            )
        except RelayConfigError as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc.strerror}") from exc
        serve_until_stopped(server, self.stdout, f"fault relay ({options['mode']} → {options['upstream']})")
