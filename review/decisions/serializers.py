from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ledger.models import Operation
from ledger.platform.storable import MAX_DURATION_SECONDS
from ledger.protocol.representation import OperationOutputSerializer, _iso, operation_representation
from ledger.protocol.selectors import operation_history
from ledger.providers.prompts import prompt_template_label
from ledger.providers.revisions import revision_number
from review.models import ReviewDecision


class ReviewItemListQuerySerializer(serializers.Serializer):
    provider = serializers.CharField(required=False, allow_blank=True, max_length=63, default="")
    # Finite and bounded (DRF's FloatField refuses NaN and infinities): now - it is a date.
    older_than_seconds = serializers.FloatField(
        required=False, allow_null=True, default=None, min_value=0, max_value=MAX_DURATION_SECONDS
    )
    q = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")


class DecisionInputSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=ReviewDecision.choices)
    note = serializers.CharField(max_length=2000)
    provider_ref = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")


class ReviewItemOutputSerializer(OperationOutputSerializer):
    """Documentation of a review item: the operation plus its evidence."""

    tenant = serializers.CharField()
    attempts_detail = serializers.ListField(child=serializers.DictField())
    events = serializers.ListField(child=serializers.DictField())


def review_item_representation(op: Operation) -> dict[str, Any]:
    """The operation plus the evidence a reviewer needs: attempts (incl. fenced results) and history."""
    body = operation_representation(op, provider_slug=op.provider.slug if op.provider_id else None)
    body["tenant"] = op.tenant.slug
    body["attempts_detail"] = [
        {
            "number": a.number,
            "outcome": a.outcome,
            "started_at": _iso(a.started_at),
            "sent_at": _iso(a.sent_at),
            "finished_at": _iso(a.finished_at),
            "error_class": a.error_class,
            "message": a.message,
            "provider_ref": a.provider_ref,
            "response_status": a.response_status,
            "adapter_revision": revision_number(a.adapter_revision_id),
            "prompt_template": prompt_template_label(a.prompt_template_id),
        }
        # all(), sorted here: served by review_item_list's prefetch, one query per page.
        for a in sorted(op.attempt_set.all(), key=lambda a: a.number)
    ]
    body["events"] = [
        {"at": _iso(e.at), "from": e.from_status, "to": e.to_status, "actor": e.actor, "reason": e.reason}
        # Its claim from the row where it is kept there (ADR 0024), then its event rows.
        for e in operation_history(op, op.events.all())
    ]
    return body
