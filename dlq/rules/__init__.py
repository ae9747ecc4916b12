"""Rules: what every room of the DLQ stands on, and none of its tables.

Settings (``conf``: ``settings.ONCEGUARD_DLQ`` over the declared ``DLQ_*`` environment, read
per call), the named errors with their HTTP status and stable code (``errors``), and where
the DLQ may send (``destinations``: a tenant's n8n base URL and timeout, a replay target's
URLs — the outbound policy, canonical, https unless on this machine).

May import: the ledger (the floor under every app), Django and the standard library — no
other room of the DLQ.
"""
