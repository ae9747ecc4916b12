"""/api/v1/runs/: a run's steps and its resume (dlq.replays.runs). The run id is a path segment that
may hold any printable character (URL-encoded); ``…/resume`` is matched first."""

from django.urls import path

from dlq.web import apis

urlpatterns = [
    path("<path:run_id>/resume", apis.RunResumeApi.as_view(), name="run-resume"),
    path("<path:run_id>", apis.RunDetailApi.as_view(), name="run-detail"),
]
