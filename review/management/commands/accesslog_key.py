from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from review.audit.accesslog import KEYS_ENV, accesslog_key_ensure, accesslog_keys


class Command(BaseCommand):
    help = (
        "Make sure the access log's HMAC key exists (created once under var/, mode 600, when"
        f" {KEYS_ENV} is not set) and say where it comes from. Never prints the key."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        accesslog_key_ensure()
        keys = accesslog_keys()
        self.stdout.write(f"access-log key {keys.current_id} from {keys.source} ({len(keys.ids)} configured)")
