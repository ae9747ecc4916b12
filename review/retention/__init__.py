"""Retention: payloads redacted past their TTL, records deleted past theirs, tombstones kept.

``policies`` holds the platform's defaults and floors, each tenant's policies and the one write
path of a policy (ADR 0006); ``purge`` the pass over one tenant and over all (the schedule
``review.retention_purge``); ``batches`` how a pass works — a budget, keyset batches each in its
own transaction, a failing row left for a later run; ``partitions`` the months of attempts and
events dropped whole when nothing in them may be kept.

May import: ``review.privacy`` (the redaction marker) and every room below it.
"""
