"""Recovery: what finishes the operations their callers left.

The sweeper (leases that expired, crash windows to reconcile by the provider's lookup, keys
past their time to live) and the eligibility recheck a retry asks first.

May import: ``ledger.protocol`` and every room below it.
"""
