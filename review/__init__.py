"""The console app: the people's side of Onceguard — review, privacy, retention, audit.

Rooms by purpose, each ``__init__`` saying what it owns and may import (the ``review-rooms``
layers contract in ``.importlinter`` keeps them pointing down):

    console               the admin site, what every page gets, the front page, own pages
    decisions | retention the review queue | redaction and deletion by policy
    privacy               payloads masked and revealed, the subject index, trail, erasure
    audit | staff         the access log and configuration trail | roles, tenant scope, sign-in
    models                the tables

Django's conventional modules keep their paths on top (``admin``, ``apps``, ``urls``,
``models``, ``migrations``, ``management``, ``templatetags``), with ``adminconfig`` (the
console's site as the default admin site), ``schedules`` and ``tasks`` (django-q2 paths stored
in the database) and ``demo`` (the first run's scenario).
"""
