"""The protocol: claims and every move of an operation.

``transitions`` is the one place an operation changes state (one named function per move,
checked against the declared table, its event row in the same transaction); ``inputs`` checks
and normalises what a claim is made of; ``services`` writes tenants, keys and provider
configuration; ``selectors`` holds the reads the API and console share; ``representation`` is
the shape an operation leaves the service in (API answers, callbacks, review items);
``callbacks`` the tenant's callback settings; ``guard`` the in-process decorator; ``tombstones``
the answers of keys retention deleted; ``evidence`` a failed attempt's de-identified evidence,
written with the failure and kept past the operation (ADR 0016).

May import: ``ledger.providers`` and every room below it.
"""
