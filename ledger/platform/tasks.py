"""django-q2: the one way every app hands work to the cluster.

Below every app, so the DLQ's and the alerts' services enqueue their own tasks without
importing their own ``tasks`` modules (which import those services: a cycle). Tests capture
enqueues by replacing ``ledger.platform.tasks.enqueue``.
"""

from __future__ import annotations

from typing import Any

from django_q.tasks import async_task


def enqueue(func: str, *args: Any) -> None:
    """Hand a task (its dotted path and ids) to django-q2 (the ORM broker by default).
    Called after commit only: ``transaction.on_commit(lambda: tasks.enqueue(...))``."""
    async_task(func, *args, q_options={"task_name": f"{func.rsplit('.', 1)[-1]}:{':'.join(map(str, args))}"})
