"""Every model change has its migration (and nothing non-deterministic makes phantom ones)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_no_model_change_is_missing_a_migration():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits non-zero when a migration would be written
        raise AssertionError(f"missing migration:\n{out.getvalue()}") from exc
    assert "No changes detected" in out.getvalue()
