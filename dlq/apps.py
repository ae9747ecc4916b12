from django.apps import AppConfig

from ledger.platform import hooks


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead-letter queue"

    def ready(self) -> None:
        # Imported here, not at module level: an AppConfig module is imported before the
        # models are loaded, and the services import models.
        from dlq.entries.services import failed_events_note_rollback
        from dlq.ingest.services import failed_event_record_for_operation
        from dlq.replays.approvals import approval_executors_connect
        from dlq.replays.services import replay_settle_for_operation

        hooks.operation_failed.connect(failed_event_record_for_operation)
        hooks.operation_finished.connect(replay_settle_for_operation)
        hooks.adapter_revision_rolled_back.connect(failed_events_note_rollback)
        # An approved four-eyes request runs the DLQ's own re-send services (ADR 0013).
        approval_executors_connect()
