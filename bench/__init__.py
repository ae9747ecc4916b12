"""Onceguard benchmarks, each a module run with ``python -m bench.<name>`` on its own database.

``python -m bench`` (``make bench``) is the ledger's hot path: the raw SQL limit vs the
in-process guard vs the HTTP API, with ratios against the issue's targets, plans and
round trips; ``python -m bench --profile`` says where the time of the guard and the API goes.
It uses the ``onceguard_bench`` database next to the one ``DATABASE_URL`` names, loopback only.
"""
