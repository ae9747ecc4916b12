"""django-q2 entry points of the console app: take ids, call a service, nothing else."""

from __future__ import annotations

from django_q.tasks import async_task

from review.models import ErasureState
from review.privacy.erasure import erasure_continue


def erasure_run_task(run_id: int) -> dict[str, int | str]:
    """Continue an erasure run from its cursor (review.privacy.erasure). Safe to run again after a
    crash, or twice at once: each batch commits with the cursor under the run's row lock. A
    pass that ran out of its time enqueues the next one."""
    run = erasure_continue(run_id=run_id)
    if run.state != ErasureState.DONE:
        async_task("review.tasks.erasure_run_task", run.pk)
    return {"run": run.pk, "state": run.state, "cursor": run.cursor, "records": len(run.targets)}
