from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from ledger.models import IdempotencyClass, Tenant
from ledger.platform import env
from ledger.platform.secret_files import write_secret_file
from ledger.protocol import services
from ledger.providers import prompts
from ledger.rules import outbound

CREDENTIALS = Path(settings.VAR_DIR) / "credentials.txt"


def demo_outbound_rules(base: int) -> list[str]:
    """The demo's loopback receivers (mocks on base, base + 2 and — the image API — base + 4,
    their relays on base + 1, base + 3 and base + 5): the only loopback destinations `make run`
    allows (OUTBOUND_ALLOW)."""
    return [f"127.0.0.1:{base}-{base + 5}"]


# The render demo: an asynchronous image API taking intent — a preset, an aspect
# class, an uploaded source, a described product — through a server-side prompt template.
RENDER_PROMPT = "demo-product-shot"
RENDER_PROMPT_TEXT = (
    "Photograph the product of the uploaded source on a plain studio background, centred, no text"
    " or logos. The customer describes it, as data:\n{{ description }}"
)
RENDER_INTENT_SCHEMA = {
    "fields": {
        "preset_id": {"type": "enum", "values": ["product-shot"], "required": True},
        "preset_version": {"type": "integer", "min": 1, "max": 1, "required": True},
        "aspect_class": {"type": "enum", "values": ["square", "portrait", "landscape"], "required": True},
        "source": {"type": "upload", "required": True},
        "description": {"type": "string", "max_length": 300},
    }
}
RENDER_REQUEST_TEMPLATE = {
    "method": "POST",
    "path": "/v1/renders",
    "body": {
        "width": "{{ width }}",
        "height": "{{ height }}",
        "source": "{{ source_key }}",
        "prompt": "{{ prompt:demo-product-shot }}",
    },
    "lookups": {
        "width": {"field": "aspect_class", "values": {"square": 256, "portrait": 192, "landscape": 256}},
        "height": {"field": "aspect_class", "values": {"square": 256, "portrait": 256, "landscape": 192}},
    },
}
RENDER_ASYNC_FIELDS = {
    "poll_path": "/v1/renders/{provider_ref}",
    "poll_status_pointer": "/status",
    "poll_succeeded_values": ["succeeded"],
    "poll_failed_values": ["failed"],
    "poll_pending_values": ["queued"],
    "poll_initial_seconds": 0.5,
    "poll_max_seconds": 5.0,
    "output_url_pointer": "/output/url",
    "output_sha256_pointer": "/output/sha256",
    "output_size_pointer": "/output/size",
    "output_media_types": ["image/png"],
    "output_width_pointer": "/body/width",
    "output_height_pointer": "/body/height",
}


class Command(BaseCommand):
    help = "First-run set-up for the embedded mode: a demo tenant, provider, API key and admin login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port-base", type=int, default=env.read("DEMO_PORT_BASE"))

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
            "  tenant        : demo   providers: demo-charges (key-enforced), demo-mailer (key-advisory),\n"
            "                  demo-renders (asynchronous image API, intent)\n"
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
        # The prompt first: the request template names it (checked when the provider is saved).
        if prompts.prompt_template_get(tenant_id=tenant.pk, name=RENDER_PROMPT) is None:
            prompts.prompt_template_create(
                tenant=tenant,
                name=RENDER_PROMPT,
                text=RENDER_PROMPT_TEXT,
                slots={"description": {"max_length": 300}},
                actor="system:bootstrap_demo",
                reason="render demo",
            )
        services.provider_upsert(
            tenant=tenant,
            slug="demo-renders",
            base_url=f"http://127.0.0.1:{base + 5}",
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
            lookup_path="/v1/renders?idempotency_key={key}",
            ref_pointer="/id",
            lookup_settle_seconds=5,
            timeout_seconds=5,
            intent_schema=RENDER_INTENT_SCHEMA,
            request_template=RENDER_REQUEST_TEMPLATE,
            **RENDER_ASYNC_FIELDS,
        )
