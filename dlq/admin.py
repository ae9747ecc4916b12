"""Django's admin autodiscovery imports ``<app>.admin``: the DLQ's console pages live in the
``dlq.web.console`` package (the web room); importing it registers them."""

from dlq.web import console  # noqa: F401  (registers the DLQ's console pages)
