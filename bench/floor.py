"""(f) The framework floor: an empty DRF APIView, routed only by the bench settings.

It runs everything the ledger's API views run before and after their own work — the
project's middleware, DRF's dispatch, the project's API-key authentication and scope
permission, content negotiation, a JSON Response — and nothing else: it reads no body and
touches no ledger row. ``python -m bench`` POSTs it the same two bodies a fresh claim→complete
sends, through the same server and client, so (c)/(f) says how much the ledger's HTTP path
costs beyond the framework under it.

This module is the bench's URLconf (``bench.http_settings``); production URLs never include
it (tests/test_api_middleware.py holds that).
"""

from __future__ import annotations

from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

# The project's URLconf as it is (its error handlers included), plus the floor view.
from config.urls import *  # noqa: F403
from config.urls import urlpatterns as project_urlpatterns


class FrameworkFloorApi(APIView):
    """POST: authenticated by API key (write scope), answers ``{"ok": true}``."""

    def post(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [path("api/v1/_bench/floor", FrameworkFloorApi.as_view()), *project_urlpatterns]
