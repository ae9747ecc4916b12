"""Django's admin autodiscovery imports ``<app>.admin``: the ledger's console pages live in
the ``ledger.web.console`` package (the web room); importing it registers them."""

from ledger.web import console  # noqa: F401  (registers the ledger's console pages)
