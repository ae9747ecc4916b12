"""Partition maintenance goes on past a table that raises (ledger.platform.passes): the other table's
months are created, the failure is counted and logged, and the next run retries it
(PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from ledger.platform import partitions
from tests.conftest import on_postgres

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not on_postgres(), reason="declarative partitioning is PostgreSQL's"),
]


def failures(job: str) -> float:
    return REGISTRY.get_sample_value("onceguard_pass_row_failures_total", {"job": job}) or 0.0


def test_a_table_that_raises_does_not_stop_the_other_tables_months(monkeypatch):
    real = partitions.partitions

    def listed(table: str) -> list[partitions.Partition]:
        if table == "ledger_attempt":
            raise RuntimeError("a table maintenance cannot handle")
        return real(table)

    monkeypatch.setattr(partitions, "partitions", listed)
    before = failures("partition_maintenance")
    # Far ahead: months no partition covers yet.
    now = datetime(2031, 1, 15, tzinfo=UTC)

    created = partitions.partitions_ensure(now=now, months_ahead=1)

    assert created == ["ledger_operationevent_p2031_01", "ledger_operationevent_p2031_02"]
    assert failures("partition_maintenance") == before + 1
    monkeypatch.setattr(partitions, "partitions", real)
    assert partitions.partitions_ensure(now=now, months_ahead=1) == [
        "ledger_attempt_p2031_01",
        "ledger_attempt_p2031_02",
    ]
