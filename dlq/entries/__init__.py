"""Entries: an entry's moves, reads and the decisions a person takes on it.

``transitions`` is the one place an entry changes state (one named function per move, checked
against ``dlq.models.FE_ALLOWED_TRANSITIONS``, its change row in the same transaction);
``selectors`` holds the reads the API, the console, the schedules and the alert clearing
share; ``services`` the decisions on one entry (resolve, discard, set its key, "safe to
resend"), the notes the ledger's hooks leave, and how a note is stored; ``payloads`` is the
seam where an entry's payload is sealed, opened and indexed.

May import: ``dlq.models``, ``dlq.rules`` (and below the DLQ: the ledger, alerts).
"""
