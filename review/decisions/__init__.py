"""Decisions: the review queue — operations whose outcome a person must decide.

``selectors`` lists the operations waiting in ``review`` with the evidence a reviewer decides on
(attempts, events); ``services`` records a decision (confirm succeeded, safe to retry, abandon)
as a guarded transition with the reviewer as actor; ``apis`` and ``serializers`` serve both
over ``/api/v1/review/``. The console's pages of the queue are ``review.admin``'s.

May import: ``review.privacy`` and every room below it (today: ``review.models`` only). Not
``review.retention`` (a sibling: neither imports the other).
"""
