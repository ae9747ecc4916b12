from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.tenants.config_changes import cli_actor
from review.staff.mfa import mfa_reset


class Command(BaseCommand):
    help = (
        "Remove every second factor (authenticator app, security keys) of a console user — a lost"
        " phone, a locked device — so they enrol again at their next password sign-in. Leaves a"
        " configuration-trail row naming who ran it (review.staff.mfa, ADR 0014)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No console user named {username!r}.")
        removed = mfa_reset(user=user, actor=cli_actor())
        self.stdout.write(f"{username}: {removed} second factor(s) removed; they enrol again at their next sign-in.")
