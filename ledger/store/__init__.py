"""The store: the ledger's named SQL and the one way it runs.

``queries.sql`` holds every statement of the protocol by name (read it to read the
protocol); ``statements`` loads and runs them, ``sql`` holds the few ad-hoc statements
(clocks, counters, planner settings), ``fast_rows`` builds model rows from a result without
the ORM's per-row cost.

May import: ``ledger.models``, ``ledger.rules``, ``ledger.platform``.
"""
