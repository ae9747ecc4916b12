from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ledger.platform import env
from review.demo import database_is_empty, demo_seed


class Command(BaseCommand):
    help = "Seed a small, clearly labelled demo scenario (tenant `demo`) on an empty database. DEMO=0 skips."

    def handle(self, *args: Any, **options: Any) -> None:
        if not env.read("DEMO"):
            self.stdout.write("demo_seed: DEMO=0, skipped")
            return
        if not database_is_empty():
            self.stdout.write("demo_seed: the database has data already, nothing seeded")
            return
        made = demo_seed()
        self.stdout.write(
            self.style.SUCCESS(
                "Demo scenario seeded in tenant `demo` (keys start with `demo:`):\n"
                f"  DLQ: a voice-call lead's CRM write that hit a 429 (entry {made['dlq_stuck']}),"
                f" an earlier one replayed ({made['replay_outcome']}, entry {made['dlq_replayed']})\n"
                f"  Review: an uncertain charge (operation {made['review_item']})\n"
                f"  Access log: entry #{made['access_log_seq']} (a reveal with its reason)\n"
                f"  Staff users (one per role) and passwords: {made['users_file']}"
            )
        )
