"""The web room: the DLQ's API views and serializers, and its console pages.

``apis`` parse input, call a service or selector and render (``dlq.urls`` and
``dlq.run_urls`` route to them); ``serializers`` are input and output shapes — a payload is
never part of an answer; ``console`` holds the console pages, registered by ``dlq.admin``.

May import: every room of the DLQ. Nothing below imports it.
"""
