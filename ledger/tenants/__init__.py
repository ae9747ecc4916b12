"""Tenants and who acts for them: API-key authentication and scopes, the trail of
configuration changes (one append-only row per change), workflow names, and the database's half
of the secret-namespace rule (ADR 0001).

May import: ``ledger.store``, ``ledger.models``, ``ledger.rules``, ``ledger.platform``.
"""
