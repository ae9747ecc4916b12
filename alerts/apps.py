from django.apps import AppConfig

from ledger.platform import hooks


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        # Imported here, not at module level: an AppConfig module is imported before the
        # models are loaded, and the services import models.
        from alerts.services import alert_raise

        hooks.alert_raised.connect(alert_raise)
