"""Workflow names (find operations by their workflow's name). An operation carries
its workflow's id only; the names a workflow was seen with are kept once each in
``WorkflowName`` — noted by the claim and submission APIs for a new key and by the DLQ for a
new entry — and a search by name (ledger.protocol.selectors.workflows_named) finds the ids, then the
operations (the partial index on the operation's tenant and workflow id).

A module of its own rather than part of ``ledger.protocol.services``: a name is not a transition of
an operation and has no event row; it is written outside the claim's transaction, after it,
so the claim's INSERT and its hot path stay as they are.
"""

from __future__ import annotations

from ledger.models import WorkflowName
from ledger.platform.caching import TtlCache

# (tenant id, workflow id, name) noted by this process lately: a busy workflow's claims
# write its name once, not once per key. (Forgetting is harmless: the insert ignores a
# name already kept.)
_NOTED: TtlCache[bool] = TtlCache("WORKFLOW_NAME_CACHE_SECONDS")


def workflow_name_note(*, tenant_id: int, workflow_id: str, name: str) -> None:
    """Keep ``name`` as a name of the tenant's workflow ``workflow_id`` (once)."""
    workflow_id, name = (workflow_id or "").strip()[:255], " ".join((name or "").split())[:255]
    if not workflow_id or not name:
        return

    def insert() -> bool:
        WorkflowName.objects.bulk_create(
            [WorkflowName(tenant_id=tenant_id, workflow_id=workflow_id, name=name)], ignore_conflicts=True
        )
        return True

    _NOTED.get((tenant_id, workflow_id, name), insert)
