"""Replays: an entry sent again, once.

``services`` is one replay (three short commits around the send; its ledger claim
``replay:{entry}:{n}``; an ambiguous one settled later by the ledger's hook), ``original``
the entry's own claim taken over or waited for first (ADR 0007), ``send`` what goes to a
target or a provider and how the answer is read, ``signatures`` what a receiver checks and
answers. On top of one replay: ``corrections`` (the next version with corrected fields),
``bulk`` (a frozen selection, paced), ``automatic`` and ``recovery`` (what the schedules
run), ``runs`` (a run's steps, resumed from the failed one).

May import: ``dlq.ingest``, ``dlq.targets`` and every room below them.
"""
