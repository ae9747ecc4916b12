"""The dead-letter queue: failures kept once, replayed once (DESIGN §4).

Rooms by purpose, each ``__init__`` saying what it owns and may import (the ``dlq-rooms``
layers contract in ``.importlinter`` keeps them pointing down):

    web              the API views and serializers, the console pages
    replays          one replay, the original claim, sending and its answer, signatures,
                     corrections, bulk and automatic replay, recovery, runs
    ingest | targets entries coming in (reports, failed operations, lead capture) | where
                     replays go (a target's one write path, its signing secrets)
    entries | n8n    an entry's moves, reads and decisions, payloads sealed | a tenant's n8n
                     (reading executions, its API, the workflow audit, the connection)
    models           the tables and their states
    rules            settings, named errors, which destinations are allowed

Django's conventional modules keep their paths on top (``admin``, ``apps``, ``urls``,
``models``, ``migrations``, ``management``), with ``run_urls`` (``/api/v1/runs/``) and
``schedules`` and ``tasks`` (django-q2 paths stored in the database).
"""
