"""Providers: everything about the destinations operations go to.

Which provider a caller or a worker means (``lookup``, cached per process), their adapters
(sending, signing, lookups by key — ``reconcile``), sealed credentials, adapter revisions and
their canary rollout, prompt templates, rate limits and in-flight caps, admission of execute
work.

May import: ``ledger.tenants``, ``ledger.store``, ``ledger.models``, ``ledger.rules``,
``ledger.platform``. Nothing here moves an operation's state: that is ``ledger.protocol``.
"""
