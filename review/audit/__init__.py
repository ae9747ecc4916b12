"""Audit: the records of who looked and who changed what.

The access log (``accesslog``): append-only rows chained per tenant under a key kept outside
the database, anchored by signed checkpoints, verified by ``accesslog_verify`` and against the
witnesses the log stream keeps (``accesslog_witness``); and the configuration trail of the
console's saves (``changes``: every add, change and delete of a configuration model leaves a
ConfigChange row in the save's transaction).

May import: ``review.models``. Not ``review.staff`` (a sibling: neither imports the other).
"""
