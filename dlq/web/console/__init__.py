"""The DLQ's console pages, registered on import (``dlq.admin`` imports this package).

- ``entries``: the dead-letter entries' list and an entry's page; ``entry_actions``: what a
  person does to entries from there (replay, correct, set the key, "safe to resend",
  resolve, discard, and the bulk actions), always through a service.
- ``replays``: the replay lineage, bulk replays and run resumes (read-only).
- ``targets``: replay targets; ``n8n``: a tenant's n8n connection — both saved through
  their room's one write path (ADR 0006).
- ``common``: what these pages share (masked payload skeletons, a replay's failure in words).

The bases every app's pages share come from the ledger's web room; the console site
(``review``) puts its own mixins in front of every page when it registers them.
"""

# Imported for their @admin.register side effect.
from dlq.web.console import entries, n8n, replays, targets  # noqa: F401
