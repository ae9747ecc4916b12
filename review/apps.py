from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate

from ledger.platform import hooks
from review.staff.roles import sync_role_groups


def _sync_roles(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    # Re-applied after every migrate: permissions added by later migrations of other apps
    # (a new DLQ model) reach their roles without another data migration.
    sync_role_groups(using=using)


class ReviewConfig(AppConfig):
    name = "review"
    verbose_name = "Console: review, privacy, retention"

    def ready(self) -> None:
        # Imported here, not at module level: an AppConfig module is imported before the
        # models are loaded, and privacy imports models.
        from review.decisions.services import review_approval_executor_connect
        from review.privacy.erasure_admin import register as register_erasure_admin
        from review.privacy.payloads import subject_index_record

        register_erasure_admin()
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="review.sync_roles")
        hooks.payload_written.connect(subject_index_record)
        # An approved "safe to retry" runs the reviewer's decision service (ADR 0013).
        review_approval_executor_connect()
