"""Nothing but the transitions modules writes an operation's or a DLQ entry's status.

Every move of an operation is a named function in ``ledger/protocol/transitions/`` and every move of
a DLQ entry one in ``dlq/entries/transitions.py`` (STYLE.md, one place for every state change): each
checks the move against the declared table, runs its named statement and writes its event
row. This test walks the syntax tree of every module outside ``tests/`` and the migrations
and fails on a status write anywhere else:

- ``.update(status=…)``, ``.create(status=…)``, ``.get_or_create``/``.update_or_create`` with a
  status, and ``Operation(status=…)``/``FailedEvent(status=…)`` built for a bulk insert, on a
  governed model (or a queryset whose model the checker cannot tell);
- ``obj.status = …`` in a function that saves ``obj``, ``save(update_fields=[… "status" …])``
  and ``bulk_update(…, ["status", …])``;
- SQL text that inserts into or sets the status of ``ledger_operation`` or
  ``dlq_failedevent``, and the name of a ``ledger/store/queries.sql`` statement that does.

Other tables have states of their own (alert deliveries, bulk replays, retention runs,
erasure requests…); their writes are told apart by the model the query starts from, and the
few the checker cannot place are listed in ``OTHER_STATE_MACHINES`` with what they write.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The modules that may write a governed status.
TRANSITIONS = ("ledger/protocol/transitions/", "dlq/entries/transitions.py")

# The models (and their tables) whose status only the transitions modules write.
GOVERNED_MODELS = frozenset({"Operation", "FailedEvent"})
GOVERNED_TABLES = ("ledger_operation", "dlq_failedevent")
# Related managers of a governed model (``tenant.operation_set``).
GOVERNED_RELATED = frozenset({"operation_set", "failedevent_set", "failed_events", "operations"})

# Status writes the checker cannot attribute to a model by reading the code, each to another
# state machine than the two governed ones: (module, function) → what it writes.
OTHER_STATE_MACHINES: dict[tuple[str, str], str] = {
    (
        "review/retention/purge.py",
        "retention_purge_tenant",
    ): "a RetentionRun's own status (running → done, partial, failed)",
    # The raw-SQL baseline the ledger's hot path is measured against writes its own narrow
    # copy of the table (bench.raw: `{table}` is the baseline's table or a scratch copy).
    ("bench/raw.py", "statements"): "the raw-SQL baseline's own table (a benchmark, never the service)",
    # Benchmarks build their data sets of millions of rows in bulk SQL, in their own databases.
    ("bench/retention.py", "_seed"): "a retention benchmark's synthetic data set, seeded in bulk",
    ("bench/scale.py", "fill"): "the scale benchmark's synthetic data set, seeded in bulk",
    ("bench/scale_dropcheck.py", "main"): "the partition-drop check's rows, finished in bulk and rolled back",
    # The work queue's mirror (ADR 0017): triggers copy the operation row's state into
    # ledger_open_operation in the statement that moved it; they never write ledger_operation.
    ("ledger/store/open_rows.py", ""): "the open rows' mirror, written by triggers from the operation row's own move",
}

# How ledger.store.statements runs a named statement: statements.operation("operation_fail", …).
STATEMENT_RUNNERS = frozenset({"operation", "operations", "execute", "text"})

SKIPPED_DIRS = frozenset({"tests", "migrations", ".venv", "node_modules", "var", ".git", "__pycache__", "docs"})

_SQL_WRITE = re.compile(
    r"\b(?:UPDATE\s+(?P<updated>\w+)\s+SET\b(?P<sets>.*?)(?:\bWHERE\b|\bRETURNING\b|$)|INSERT\s+INTO\s+(?P<inserted>\w+))",
    re.IGNORECASE | re.DOTALL,
)
_SETS_STATUS = re.compile(r"(?:^|,)\s*status\s*=", re.IGNORECASE)
_STATEMENT = re.compile(r"^-- name: (\w+) --$", re.MULTILINE)


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    line: int
    function: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function or 'module'}): {self.what}"


def sql_writes_status(text: str) -> bool:
    """Whether SQL text inserts into, or sets the status of, a governed table. A table spelled
    by a placeholder (``{table}``) counts: the checker cannot tell it is not one."""
    for match in _SQL_WRITE.finditer(text):
        table = (match.group("updated") or match.group("inserted") or "").lower()
        governed = table in GOVERNED_TABLES or table == "_"
        if match.group("inserted") is not None:
            if governed and re.search(r"\bstatus\b", text[match.end() : match.end() + 400], re.IGNORECASE):
                return True
        elif governed and _SETS_STATUS.search(match.group("sets") or ""):
            return True
    return False


def status_statements(queries: str) -> frozenset[str]:
    """The names of the ``queries.sql`` statements that write an operation's status."""
    parts = _STATEMENT.split(queries)
    return frozenset(
        name
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
        if sql_writes_status("\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--")))
    )


def _chain_root(node: ast.AST) -> tuple[str | None, list[str]]:
    """The name a call/attribute chain starts from and the attributes along it."""
    attrs: list[str] = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id, list(reversed(attrs))
        else:
            return None, list(reversed(attrs))


def _model_of(node: ast.AST, assigned: dict[str, ast.AST], depth: int = 0) -> str | None:
    """The model a queryset expression reads, as far as the source says: a class name, or
    ``"?"`` when it cannot tell (a variable assigned from elsewhere, a parameter)."""
    root, attrs = _chain_root(node)
    for attr in attrs:
        if attr in GOVERNED_RELATED:
            return attr
        if attr.endswith("_set"):
            return attr
    if root is None:
        return "?"
    if "objects" in attrs or "_default_manager" in attrs or "_base_manager" in attrs:
        return root
    if root[:1].isupper():
        return root
    if root in assigned and depth < 5:
        return _model_of(assigned[root], assigned, depth + 1)
    return "?"


def _governed(model: str | None) -> bool:
    return model is None or model == "?" or model in GOVERNED_MODELS or model in GOVERNED_RELATED


def _has_status(keywords: list[ast.keyword], assigned: dict[str, ast.AST]) -> bool:
    for kw in keywords:
        if kw.arg == "status":
            return True
        if kw.arg is None:  # **values: a dict literal the function built is read
            value = assigned.get(kw.value.id) if isinstance(kw.value, ast.Name) else kw.value
            if isinstance(value, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "status" for k in value.keys
            ):
                return True
        if kw.arg == "defaults" and isinstance(kw.value, ast.Dict):
            if any(isinstance(k, ast.Constant) and k.value == "status" for k in kw.value.keys):
                return True
    return False


def _names_status(node: ast.AST | None) -> bool:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value == "status" for e in node.elts)
    return isinstance(node, ast.Constant) and node.value == "status"


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        # A placeholder reads as an unnamed table: the checker cannot tell it is not a governed one.
        return "".join(v.value if isinstance(v, ast.Constant) else " _ " for v in node.values)
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, statements: frozenset[str]):
        self.path = path
        self.statements = statements
        self.function = ""
        self.assigned: dict[str, ast.AST] = {}
        self.saved: set[str] = set()
        self.found: list[Violation] = []

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append(Violation(self.path, getattr(node, "lineno", 0), self.function, what))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer = (self.function, self.assigned, self.saved)
        self.function = node.name if not outer[0] else f"{outer[0]}.{node.name}"
        self.assigned = dict(self.assigned)
        self.saved = set()
        # What the function assigns and saves, read first: a write may come before its save.
        for child in ast.walk(node):
            if isinstance(child, ast.Assign):
                for target in child.targets:
                    if isinstance(target, ast.Name):
                        self.assigned[target.id] = child.value
            elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and child.value is not None:
                self.assigned[child.target.id] = child.value
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                if child.func.attr in {"save", "asave", "full_clean"}:
                    root, _ = _chain_root(child.func.value)
                    if root:
                        self.saved.add(root)
        self.generic_visit(node)
        self.function, self.assigned, self.saved = outer

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Attribute) and target.attr == "status":
                root, _ = _chain_root(target.value)
                if root in self.saved:
                    self._flag(node, f"{root}.status = … then saved")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            name = func.attr
            if name in {"update", "create", "get_or_create", "update_or_create", "aupdate", "acreate"}:
                if _has_status(node.keywords, self.assigned):
                    model = _model_of(func.value, self.assigned)
                    if _governed(model):
                        self._flag(node, f".{name}(status=…) on {model}")
            elif name in {"bulk_update", "abulk_update"}:
                fields = node.args[1] if len(node.args) > 1 else None
                fields = next((kw.value for kw in node.keywords if kw.arg == "fields"), fields)
                if _names_status(fields) and _governed(_model_of(func.value, self.assigned)):
                    self._flag(node, "bulk_update of status")
            elif name in {"save", "asave"}:
                fields = next((kw.value for kw in node.keywords if kw.arg == "update_fields"), None)
                if _names_status(fields):
                    self._flag(node, "save(update_fields=[… 'status' …])")
        if isinstance(func, ast.Attribute) and func.attr in STATEMENT_RUNNERS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and first.value in self.statements:
                self._flag(node, f"runs the status-writing statement {first.value!r}")
        if isinstance(func, ast.Name) and func.id in GOVERNED_MODELS and _has_status(node.keywords, self.assigned):
            self._flag(node, f"{func.id}(status=…) built for an insert")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and sql_writes_status(node.value):
            self._flag(node, "SQL that writes a governed status")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        text = _text(node)
        if text and sql_writes_status(text):
            self._flag(node, "SQL that writes a governed status")
        else:
            self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        # Adjacent literals are one Constant already; "a" + "b" is read as its text.
        parts = [_text(side) for side in (node.left, node.right)]
        if all(p is not None for p in parts) and sql_writes_status("".join(parts)):  # type: ignore[arg-type]
            self._flag(node, "SQL that writes a governed status")
            return
        self.generic_visit(node)


def check_source(source: str, *, path: str = "<source>", statements: frozenset[str] = frozenset()) -> list[Violation]:
    """Every status write in one module's source."""
    checker = _Checker(path, statements)
    checker.visit(ast.parse(source, filename=path))
    # A SQL text split over several literals can be reported by each of its parts.
    return sorted(set(checker.found))


def _modules() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if SKIPPED_DIRS & set(relative.parts[:-1]) or relative.name.startswith("test_"):
            continue
        found.append(relative)
    return found


def _allowed(violation: Violation) -> bool:
    if violation.path.startswith(TRANSITIONS):
        return True
    return (violation.path, violation.function.split(".")[0]) in OTHER_STATE_MACHINES or (
        violation.path,
        violation.function,
    ) in OTHER_STATE_MACHINES


def status_writes_outside_transitions() -> list[Violation]:
    statements = status_statements((ROOT / "ledger" / "store" / "queries.sql").read_text(encoding="utf-8"))
    found: list[Violation] = []
    for relative in _modules():
        source = (ROOT / relative).read_text(encoding="utf-8")
        found += [v for v in check_source(source, path=relative.as_posix(), statements=statements) if not _allowed(v)]
    return found


def test_no_status_is_written_outside_the_transitions_modules():
    found = status_writes_outside_transitions()
    assert not found, "status written outside the transitions modules:\n" + "\n".join(map(str, found))


def test_every_exception_names_a_function_that_still_writes_a_status():
    # A stale entry would let a future write through unseen.
    statements = status_statements((ROOT / "ledger" / "store" / "queries.sql").read_text(encoding="utf-8"))
    for path, function in OTHER_STATE_MACHINES:
        source = (ROOT / path).read_text(encoding="utf-8")
        hits = [
            v for v in check_source(source, path=path, statements=statements) if v.function.split(".")[0] == function
        ]
        assert hits, f"{path}:{function} is listed in OTHER_STATE_MACHINES but writes no status"


def test_the_queries_file_names_its_status_writing_statements():
    statements = status_statements((ROOT / "ledger" / "store" / "queries.sql").read_text(encoding="utf-8"))
    assert {"operation_insert", "operation_claim_pg", "operation_complete", "operation_fail"} <= statements
    assert "operation_heartbeat" not in statements and "event_insert" not in statements


# --- The checker itself catches each kind of write -------------------------------------------

PLANTED = {
    "orm update": "def f(pk):\n    Operation.objects.filter(pk=pk).update(status='failed')\n",
    "queryset variable": "def f(pk):\n    rows = FailedEvent.objects.filter(pk=pk)\n    rows.update(status='discarded')\n",
    "unknown queryset": "def f(rows):\n    rows.update(status='failed')\n",
    "create": "def f(t):\n    FailedEvent.objects.create(tenant=t, status='pending')\n",
    "related manager": "def f(tenant):\n    tenant.operation_set.update(status='abandoned')\n",
    "get_or_create defaults": "def f(t):\n    Operation.objects.get_or_create(key='k', defaults={'status': 'queued'})\n",
    "constructed for bulk insert": "def f(t):\n    return [Operation(tenant=t, status='queued')]\n",
    "assign and save": "def f(op):\n    op.status = 'failed'\n    op.save()\n",
    "save update_fields": "def f(op):\n    op.save(update_fields=['status', 'updated_at'])\n",
    "bulk_update": "def f(ops):\n    Operation.objects.bulk_update(ops, ['status'])\n",
    "raw sql": "def f(c):\n    c.execute(\"UPDATE ledger_operation SET done_at = now(), status = 'failed' WHERE id = %s\")\n",
    "raw sql f-string": "def f(c, t):\n    c.execute(f\"UPDATE {t} SET status = 'failed' WHERE id = %s\")\n",
    "raw insert": "def f(c):\n    c.execute('INSERT INTO dlq_failedevent (tenant_id, status) VALUES (%s, %s)')\n",
    "named statement": "def f():\n    statements.operation('operation_fail', {})\n",
}

CLEAN = """
def f(op, rows):
    Operation.objects.filter(pk=op.pk, status='queued').update(next_attempt_at=None)
    BulkReplay.objects.filter(pk=1).update(status='done')
    op.attempt_set.update(outcome='fenced')
    AlertDelivery.objects.create(status='pending')
    op.status == 'failed'
    statements.execute('attempt_finish', {})
    c.execute("UPDATE ledger_operation SET reconcile_until = NULL WHERE status = 'uncertain'")
    c.execute("UPDATE dlq_bulkreplay SET status = 'done'")
"""


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_the_checker_catches_a_planted_status_write(kind):
    found = check_source(PLANTED[kind], statements=frozenset({"operation_fail"}))
    assert len(found) == 1, found


def test_the_checker_passes_writes_that_are_not_a_governed_status():
    assert check_source(CLEAN, statements=frozenset({"operation_fail"})) == []
