"""Review queue: operations whose outcome a human must decide (DESIGN §3 `review`)."""

from __future__ import annotations

from django.db import models

from ledger.models import Operation, OperationStatus


class ReviewDecision(models.TextChoices):
    # The reviewer has evidence the effect happened (e.g. seen in the provider's dashboard).
    CONFIRM_SUCCEEDED = "confirm_succeeded", "confirm succeeded"
    # The reviewer asserts the effect did not happen: re-issue with the original key.
    SAFE_TO_RETRY = "safe_to_retry", "safe to retry"
    # Do not do it at all.
    ABANDON = "abandon", "abandon"


class ReviewItemManager(models.Manager["ReviewItem"]):
    def get_queryset(self) -> models.QuerySet[ReviewItem]:
        return super().get_queryset().filter(status=OperationStatus.REVIEW)


class ReviewItem(Operation):
    """An operation in `review`, as the review console and API see it."""

    objects = ReviewItemManager()

    class Meta:
        proxy = True
        verbose_name = "review item"
        permissions = [("decide_reviewitem", "Can record review decisions")]
