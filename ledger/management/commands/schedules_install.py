from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Install (idempotently) every django-q2 schedule the service needs."

    def handle(self, *args: Any, **options: Any) -> None:
        # Each installed app that has schedules exposes install_schedules() in its
        # `schedules` module; found by name, so the ledger names no app above it.
        for config in apps.get_app_configs():
            name = f"{config.name}.schedules"
            if find_spec(name) is None:
                continue
            module = import_module(name)
            if not hasattr(module, "install_schedules"):
                continue
            for schedule in module.install_schedules():
                self.stdout.write(f"schedule {schedule} installed")
