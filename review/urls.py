from django.urls import path

from review.decisions import apis

urlpatterns = [
    path("items", apis.ReviewItemListApi.as_view(), name="review-item-list"),
    path("items/<int:operation_id>/decision", apis.ReviewDecisionApi.as_view(), name="review-decision"),
]
