"""The web room: the ledger's API views and serializers, and its console pages.

The ``apis`` package (operations and claims, files, providers) parses input, calls a service
or selector and renders; ``serializers`` are input shapes; the ``console`` package holds the
console pages (registered by ``ledger.admin``): operations, tenants and keys, providers;
``console_base`` what every app's console pages share, first the rule that a list answers
only the lookups it offers; ``display`` formats every value one way; ``story`` and
``failures`` put a row's why into words; ``pagination`` checks cursors.

May import: every room of the ledger. Nothing below imports it.
"""
