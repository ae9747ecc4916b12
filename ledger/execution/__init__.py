"""Execute mode: the service performs the effect.

Submissions (``submission``) and the workers' take, send and record (``attempts``), the worker
loop, polling of asynchronous providers, intents translated into a request (``translation``),
uploads, validated outputs and the bytes behind both (``objects``).

May import: ``ledger.recovery`` and every room below it.
"""
