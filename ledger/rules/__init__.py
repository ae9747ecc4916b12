"""Rules: pure checks of values, no database.

The key rule and keys derived from personal data, the outbound policy (which URLs the
deployment allows), provider-configuration checks (secret-name namespaces, paths), intent
schemas and templates, and which payload paths are searchable. The models validate their
fields with these; the services and the console show the same messages.

May import: ``ledger.platform``.
"""
