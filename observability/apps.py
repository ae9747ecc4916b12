from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Health probes, the /metrics endpoint and the scheduler watch: above every app (it
    reads the ledger, the DLQ and django-q2), imported by none of them."""

    name = "observability"
    verbose_name = "Observability"
