from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate

from ledger.platform import hooks
from ledger.tenants.tenant_namespaces import namespace_triggers_ensure


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"

    def ready(self) -> None:
        # After every migrate: SQLite drops a table's triggers when a later migration
        # rebuilds it (ledger.tenants.tenant_namespaces).
        post_migrate.connect(namespace_triggers_ensure, sender=self, dispatch_uid="ledger.namespace_triggers")
        # Times read by psycopg's C loader where it gives Django's values (ledger.platform._adapters.psycopg_private).
        connection_created.connect(_timestamps_in_c, dispatch_uid="ledger.timestamps_in_c")
        # A finished extraction is scored against its document's manifest in the transaction
        # that finishes it (ADR 0022). Imported here: the module imports models, which the app
        # registry loads only after this module.
        from ledger.execution import manifests

        hooks.operation_finished.connect(manifests.manifest_score_after_finish)

        # Four-eyes (ADR 0013): an approved re-run of recalled outputs runs here (ADR 0020).
        # Imported here, not at module level: an AppConfig module is imported before the
        # models are loaded, and the services import models.
        from ledger.execution.rerun import recalled_rerun_approved
        from ledger.models import ApprovalKind
        from ledger.protocol.approvals import approval_executor_register

        approval_executor_register(ApprovalKind.RECALLED_RERUN, recalled_rerun_approved)


def _timestamps_in_c(sender: object, connection: object, **kwargs: object) -> None:
    from ledger.platform._adapters.psycopg_private import timestamps_loaded_in_c

    timestamps_loaded_in_c(connection)
