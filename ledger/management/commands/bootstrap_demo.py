from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from ledger import outbound, services
from ledger.models import IdempotencyClass, Tenant
from ledger.secret_files import write_secret_file

CREDENTIALS = Path(settings.VAR_DIR) / "credentials.txt"


def demo_outbound_rules(base: int) -> list[str]:
    """The demo's loopback receivers (mocks on base and base + 2, their relays on base + 1
    and base + 3): the only loopback destinations `make run` allows (OUTBOUND_ALLOW)."""
    return [f"127.0.0.1:{base}-{base + 3}"]


class Command(BaseCommand):
    help = "First-run set-up for the embedded mode: a demo tenant, provider, API key and admin login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port-base", type=int, default=int(os.environ.get("DEMO_PORT_BASE", "8010")))

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug="demo").first() or services.tenant_create(slug="demo", name="Demo tenant")
        # Every start: the demo providers follow DEMO_PORT_BASE (where run_all starts them).
        self._providers(tenant, options["port_base"])
        if CREDENTIALS.exists():
            self.stdout.write(CREDENTIALS.read_text())
            return
        _, secret = services.apikey_create(tenant=tenant, scopes=["read", "write", "admin"], name="demo")
        password = secrets.token_urlsafe(12)
        User = get_user_model()
        user = User.objects.filter(username="admin").first() or User(username="admin", is_staff=True, is_superuser=True)
        user.set_password(password)
        user.save()
        text = (
            "Onceguard demo credentials (also in var/credentials.txt):\n"
            f"  console login : admin / {password}\n"
            f"  API key       : {secret}\n"
            "  tenant        : demo   providers: demo-charges (key-enforced), demo-mailer (key-advisory)\n"
        )
        # Mode 600 from birth: the demo's passwords and API key are never world-readable.
        write_secret_file(CREDENTIALS, text, replace=True)
        self.stdout.write(text)

    def _providers(self, tenant: Tenant, base: int) -> None:
        # Each demo provider points at its fault relay (port + 1), which forwards to the mock:
        # loopback ports the demo's own processes allow (run_all exports demo_outbound_rules).
        with outbound.allowing(*demo_outbound_rules(base)):
            self._upsert(tenant, base)

    def _upsert(self, tenant: Tenant, base: int) -> None:
        services.provider_upsert(
            tenant=tenant,
            slug="demo-charges",
            base_url=f"http://127.0.0.1:{base + 1}",
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
            lookup_path="/charges?idempotency_key={key}",
            ref_pointer="/id",
            status_pointer="/status",
            success_values=["succeeded"],
            lookup_settle_seconds=5,
            timeout_seconds=5,
        )
        services.provider_upsert(
            tenant=tenant,
            slug="demo-mailer",
            base_url=f"http://127.0.0.1:{base + 3}",
            idempotency_class=IdempotencyClass.KEY_ADVISORY,
            timeout_seconds=5,
        )
