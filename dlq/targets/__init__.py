"""Targets: where replays go.

``services`` is the one write path of a replay target (ADR 0006: ``manage.py
replaytarget_upsert`` and the console), its signing secrets (made on first use, rotated with
an overlap) and what the console says of them instead of showing them.

May import: ``dlq.entries``, ``dlq.n8n``, ``dlq.models``, ``dlq.rules`` (and the ledger).
Not ``dlq.ingest``: a target is configured whatever came in.
"""
