"""The console: the admin site every app's pages are registered on, and its own pages.

``site`` is the admin site (its front page, reveal and data-subject search, and the addresses
of the pages below); ``pages`` what every ModelAdmin gets on it (payload columns masked, worded
flags and durations, the payload panel, the CSV export); ``listing`` renders the lists' rows
with the per-page work done once; ``forms`` the site's own forms. The front page: ``round``
(the operator's round: every list by the question it answers, with its count), ``dashboard``
(numbers, attention list, charts) over ``selectors`` (bounded counts, activity per hour).
Pages of their own: ``history_pages`` (attempts and events, keyed by time), ``object_pages``
(uploads and published outputs), ``run_pages`` (a run's steps and its resume),
``subject_pages`` (a person's data trail), ``n8n_audit_pages`` (a tenant's n8n workflows) and
``sign_in_pages`` (single sign-on's way out and back, the second factor's pages: ADR 0014).

May import: every room of review. Nothing of review imports it but the modules on top
(``review.admin``, ``review.schedules``, ``review.adminconfig`` by its dotted path) and the
``console`` template tags.
"""
