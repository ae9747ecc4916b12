"""The access log checked against its witnesses outside the database.

``review.audit.accesslog`` writes one ``accesslog_witness`` line per appended row to the structured
log stream (``tenant``, ``seq``, ``id``, ``hash``) once the row is committed. A log pipeline
keeps those lines where someone who can write the database cannot reach them. This module
reads them back — from JSON lines (``LOG_FORMAT=json``) or the readable ``key=value`` lines,
mixed with every other line of the stream, with whatever prefix a collector adds — and
reports each witnessed row that the database no longer holds, or holds with another hash.
So deleting the newest rows is seen at once, not only after the next checkpoint.

Rows at or below the tenant's newest signed ``purge`` checkpoint were removed by retention:
their witnesses are not reported (the purge anchor's own hash is still compared).
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from review.audit.accesslog import WITNESS_EVENT, ChainProblem, verified_purge_anchor
from review.models import AccessLog

_HASH = re.compile(r"^[0-9a-f]{64}$")
# `… accesslog_witness tenant=1 seq=2 id=3 hash=… <bound context>` as the key=value
# renderer writes it (a value with spaces or quotes is a JSON string there).
_KV_EVENT = re.compile(rf"(?:^|\s){WITNESS_EVENT}(?=\s)")
_KV_PAIR = re.compile(r"\s([A-Za-z_][A-Za-z0-9_]*)=(\"(?:[^\"\\]|\\.)*\"|\S*)")
_BATCH = 2000


@dataclass(frozen=True)
class Witness:
    source: str  # "<file>:<line>"
    tenant_id: int
    seq: int
    row_id: int | None
    hash: str


@dataclass(frozen=True)
class Unreadable:
    source: str
    reason: str


def _fields(line: str) -> dict[str, Any] | None:
    """The witness fields of one line, or None when the line is not a witness."""
    if WITNESS_EVENT not in line:
        return None
    start = line.find("{")
    if start >= 0:
        try:
            document = json.loads(line[start:])
        except ValueError:
            document = None
        if isinstance(document, dict):
            return document if document.get("event") == WITNESS_EVENT else None
    match = _KV_EVENT.search(line)
    if match is None:
        return None
    return dict(_KV_PAIR.findall(line, match.end()))


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def witnesses(lines: Iterable[str], *, name: str) -> Iterator[Witness | Unreadable]:
    """Every witness in ``lines``; a witness line without usable fields is Unreadable (an
    edited log is a finding too)."""
    for number, line in enumerate(lines, start=1):
        fields = _fields(line)
        if fields is None:
            continue
        source = f"{name}:{number}"
        tenant_id, seq, row_id = _int(fields.get("tenant")), _int(fields.get("seq")), _int(fields.get("id"))
        hash_ = fields.get("hash")
        if tenant_id is None or seq is None or not isinstance(hash_, str) or not _HASH.match(hash_):
            yield Unreadable(source, "a witness line without a tenant, seq and 64-digit hash")
            continue
        yield Witness(source, tenant_id, seq, row_id, hash_)


class _Anchors:
    """Each tenant's verified purge anchor, read again before a missing row is reported (a
    purge may have run since it was first read)."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[int, str]] = {}

    def get(self, tenant_id: int, *, fresh: bool = False) -> tuple[int, str]:
        if fresh or tenant_id not in self._known:
            self._known[tenant_id] = verified_purge_anchor(tenant_id)
        return self._known[tenant_id]


def _check(batch: list[Witness], anchors: _Anchors, problems: list[ChainProblem]) -> None:
    by_tenant: dict[int, list[Witness]] = defaultdict(list)
    for w in batch:
        by_tenant[w.tenant_id].append(w)
    for tenant_id, items in by_tenant.items():
        stored = dict(
            AccessLog.objects.filter(tenant_id=tenant_id, seq__in={w.seq for w in items}).values_list("seq", "hash")
        )
        for w in items:
            seen = f"witnessed at {w.source} (row id {w.row_id}, hash {w.hash[:12]}…)"
            if w.seq in stored:
                if stored[w.seq] != w.hash:
                    problems.append(
                        ChainProblem(tenant_id, w.seq, f"hash differs from the one {seen}: the row was replaced")
                    )
                continue
            anchor_seq, anchor_hash = anchors.get(tenant_id)
            if w.seq > anchor_seq:
                anchor_seq, anchor_hash = anchors.get(tenant_id, fresh=True)
            if w.seq > anchor_seq:
                problems.append(ChainProblem(tenant_id, w.seq, f"row {w.seq} is missing from the database, {seen}"))
            elif w.seq == anchor_seq and anchor_hash != w.hash:
                problems.append(ChainProblem(tenant_id, w.seq, f"the purge anchor's hash differs from the one {seen}"))


@dataclass
class WitnessReport:
    checked: int = 0
    # Rows the database lost or changed, in the chain's own terms.
    problems: list[ChainProblem] = field(default_factory=list)
    # What is wrong with the logs themselves (edited witness lines, no witness at all).
    log_problems: list[str] = field(default_factory=list)


def accesslog_verify_witnessed(
    *, logs: Iterable[str], tenant_ids: list[int] | None = None, stdin: TextIO | None = None
) -> WitnessReport:
    """Check the database against the witness lines of each log file (``-`` = standard
    input). No witness line at all while the database holds access-log rows is a finding
    too: the wrong file, or the lines never reached the log."""
    logs = list(logs)
    report = WitnessReport()
    anchors = _Anchors()
    wanted = set(tenant_ids) if tenant_ids is not None else None
    for name in logs:
        handle = (stdin or sys.stdin) if name == "-" else Path(name).open(encoding="utf-8", errors="replace")
        try:
            batch: list[Witness] = []
            for found in witnesses(handle, name=name):
                if isinstance(found, Unreadable):
                    report.log_problems.append(f"{found.source}: {found.reason}")
                    continue
                if wanted is not None and found.tenant_id not in wanted:
                    continue
                batch.append(found)
                if len(batch) >= _BATCH:
                    _check(batch, anchors, report.problems)
                    report.checked += len(batch)
                    batch = []
            _check(batch, anchors, report.problems)
            report.checked += len(batch)
        finally:
            if name != "-":
                handle.close()
    rows = AccessLog.objects.filter(tenant_id__in=wanted) if wanted is not None else AccessLog.objects.all()
    if report.checked == 0 and rows.exists():
        report.log_problems.append(
            f"no {WITNESS_EVENT} lines in {', '.join(logs)} while the database holds access-log rows:"
            " the wrong log, or the witness lines do not reach it"
        )
    return report
