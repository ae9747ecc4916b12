from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.platform import env

REFERENCE = Path(settings.BASE_DIR) / "docs" / "reference" / "settings.md"


class Command(BaseCommand):
    help = "Write docs/reference/settings.md from the settings table (ledger.platform.env); --check only compares."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="fail when the page is not the table's")

    def handle(self, *args: Any, **options: Any) -> None:
        page = env.reference_markdown()
        if options["check"]:
            if not REFERENCE.exists() or REFERENCE.read_text() != page:
                raise CommandError(f"{REFERENCE} is stale: run `python manage.py settings_reference`.")
            return
        REFERENCE.write_text(page)
        self.stdout.write(f"wrote {REFERENCE} ({len(env.SETTINGS)} settings)")
