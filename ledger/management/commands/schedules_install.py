from __future__ import annotations

from importlib import import_module
from typing import Any

from django.core.management.base import BaseCommand

# Each app that has schedules exposes install_schedules() in its schedules module.
SCHEDULE_MODULES = ["ledger.schedules", "dlq.schedules", "review.schedules"]


class Command(BaseCommand):
    help = "Install (idempotently) every django-q2 schedule the service needs."

    def handle(self, *args: Any, **options: Any) -> None:
        for name in SCHEDULE_MODULES:
            try:
                module = import_module(name)
            except ModuleNotFoundError:
                continue
            for schedule in module.install_schedules():
                self.stdout.write(f"schedule {schedule} installed")
