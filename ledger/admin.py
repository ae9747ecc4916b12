"""Django's admin autodiscovery imports ``<app>.admin``: the ledger's console pages live in
``ledger.web.console`` (the web room); importing it registers them."""

from ledger.web import console  # noqa: F401  (registers the ledger's console pages)
