"""Execute mode writes the fence journal too (ADR 0012): the worker's take, which writes the sent
marker because it sends right after, and the recorded outcome — each before its commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.execution.submission import operation_submit
from ledger.protocol import fencing
from tests.execute.support import run_due

pytestmark = pytest.mark.django_db


def test_a_workers_take_and_its_outcome_are_journaled_and_a_queued_row_is_not(
    tenant, enforced, settings: Any, tmp_path: Path
) -> None:
    provider, _ = enforced
    folder = tmp_path / "fence-journal"
    settings.ONCEGUARD = {**settings.ONCEGUARD, "FENCE_JOURNAL": "local", "FENCE_JOURNAL_DIR": str(folder)}
    fencing.view_reset()
    try:
        operation_submit(
            tenant=tenant,
            key="x-journaled",
            provider="charges",
            request={"method": "POST", "path": "/charges", "body": {"a": 1}},
        )

        def lines() -> list[str]:
            return [line for path in sorted(folder.glob("*/*.journal")) for line in path.read_text().splitlines()]

        assert lines() == []
        (done,) = run_due()
        assert done.status == "succeeded"
        assert lines() == [
            f"k\t{tenant.pk}\t{provider.pk}\tclaimed\tx-journaled",
            f"k\t{tenant.pk}\t{provider.pk}\tsucceeded\tx-journaled",
        ]
    finally:
        fencing.view_reset()
