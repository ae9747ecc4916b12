"""The platform: what every room stands on, and nothing of the ledger's tables.

Owns the process-wide parts: declared settings (``env``), named errors, sealing and key rings
(``crypto``, ``secret_files``, ``masking``), logs and redaction, a record's own values cut out of
free text (``cutting``), telemetry, traces (``tracing``, ADR 0015), the database-outage test,
per-process caches, the hooks higher apps connect to, what a stored value must be (``storable``),
durations in words, per-row isolation of periodic passes (``passes``), batched backfills,
partitions, the enqueue helper (``tasks``) and the one home of private framework APIs
(``_adapters``, ADR 0004).

May import: Django, the standard library and third-party packages — no other room, and
``ledger.models`` only under ``TYPE_CHECKING`` (crypto must import before the app registry).
"""
