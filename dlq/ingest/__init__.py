"""Ingest: how entries come in.

``services`` stores a reported failure once by its identity (a repost, an n8n retry, another
occurrence of an open business key — each folded into its entry) and writes the entry of a
terminally failed operation from the ledger's hook; ``parsing`` reads a report (our
envelope, n8n's Error Trigger payloads, anything else kept raw), pure functions;
``fetch`` is lead capture, the failed items fetched from the tenant's n8n after commit.

May import: ``dlq.entries``, ``dlq.n8n``, ``dlq.models``, ``dlq.rules`` (and the ledger,
alerts). Not ``dlq.targets``: entries come in whatever their target.
"""
