"""n8n: a tenant's n8n instance, as the DLQ talks to it.

``client`` reads a failed execution's input items for lead capture, every request bounded and
through the outbound policy; ``api`` is the rest of n8n's public API in use (deleting an
execution for an erasure, listing workflows); ``audit`` reads the workflows for what can send
twice, fail unseen or keep people's data; ``connections`` is the one write path of the
tenant's connection (ADR 0006). No entry is written here: ``dlq.ingest.fetch`` stores what
the client read.

May import: ``dlq.models``, ``dlq.rules`` (and the ledger).
"""
