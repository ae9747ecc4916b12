from django.urls import path

from dlq.web import apis

urlpatterns = [
    path("events", apis.FailedEventsApi.as_view(), name="dlq-events"),
    path("events/<int:event_id>", apis.FailedEventDetailApi.as_view(), name="dlq-event-detail"),
    path("events/<int:event_id>/replay", apis.FailedEventReplayApi.as_view(), name="dlq-event-replay"),
    path(
        "events/<int:event_id>/resend-decision",
        apis.FailedEventResendDecisionApi.as_view(),
        name="dlq-event-resend-decision",
    ),
    path("events/<int:event_id>/resolve", apis.FailedEventResolveApi.as_view(), name="dlq-event-resolve"),
    path("events/<int:event_id>/discard", apis.FailedEventDiscardApi.as_view(), name="dlq-event-discard"),
    path("events/<int:event_id>/correct", apis.FailedEventCorrectApi.as_view(), name="dlq-event-correct"),
    path("replays", apis.BulkReplayApi.as_view(), name="dlq-bulk-replays"),
    path("replays/<int:bulk_id>", apis.BulkReplayDetailApi.as_view(), name="dlq-bulk-replay-detail"),
]
