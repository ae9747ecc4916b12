"""The ledger's console pages, registered on import (``ledger.admin`` imports this package).

- ``operations``: the operations list, an operation's page, cancel and retry now.
- ``tenants``: tenants, API keys and the configuration trail.
- ``providers``: providers and their adapter rollout, prompt templates.
- ``fencing``: the holds a restored backup left, and their resolve page (ADR 0012).
- ``evidence``: failed attempts' evidence, kept past the operations' retention (ADR 0016).
- ``approvals``: re-sends waiting for a second person, and their decide page (ADR 0013).

What every app's console pages share — the base ModelAdmins, the tenant column, the
selector-backed search, ``may_view``, read-only inlines — is ``ledger.web.console_base``, which
dlq, review and alerts import too; nothing imports these pages but this package.
"""

# Imported for their @admin.register side effect.
from ledger.web.console import approvals, evidence, fencing, operations, providers, tenants  # noqa: F401
