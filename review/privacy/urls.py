from django.urls import path

from review.privacy import apis as privacy_apis

urlpatterns = [
    path(
        "operations/<int:operation_id>/payload",
        privacy_apis.OperationPayloadRevealApi.as_view(),
        name="operation-payload-reveal",
    ),
    path(
        "dlq/events/<int:event_id>/payload",
        privacy_apis.FailedEventPayloadRevealApi.as_view(),
        name="dlq-event-payload-reveal",
    ),
]
