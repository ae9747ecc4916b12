"""Execute mode: the service performs the effect.

Submissions (``submission``) and the workers' take, send and record (``attempts``), the worker
loop, polling of asynchronous providers, intents translated into a request (``translation``),
uploads, validated outputs and the bytes behind both (``objects``), evaluation manifests and
the scores of extractions against them (``manifests``, ADR 0022).

May import: ``ledger.recovery`` and every room below it.
"""
