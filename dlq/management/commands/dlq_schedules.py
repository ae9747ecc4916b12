from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django_q.models import Schedule

from dlq.schedules import install_schedules


class Command(BaseCommand):
    help = "Install (or update) the DLQ's django-q2 schedules: auto-replay, alert flush, replay recovery."

    def handle(self, *args: Any, **options: Any) -> None:
        for name in install_schedules(Schedule):
            self.stdout.write(f"schedule: {name}")
