"""DRF's content negotiation, answered without parsing for what API clients send.

The one piece of the API's old short-cuts that cleared the 10 % bar when each was put back
alone on the framework path (python -m bench.compare, granian 2×4, 12 interleaved rounds in
two runs): this class together with a direct JSON rendering (ledger.web.apis.answer, since
removed) served fresh claim→complete at 1.28× [0.72–2.79] and replays at 1.43× [0.40–3.25]
the rate of DRF's DefaultContentNegotiation with a DRF Response, median [range] of the
per-round ratios, and cut the app's CPU per op in-process by 15–19 %; negotiation is about
two thirds of that pair's CPU (~40 µs of ~60 µs per request), so it stays and the direct
rendering went. tests/test_negotiation.py proves it answers exactly like DRF's class.
"""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer

JSON = "application/json"


class JsonFastNegotiation(DefaultContentNegotiation):
    """The common cases short-cut, everything else negotiated by DRF as before.

    Renderer: when a view renders only JSON and the request asks for JSON or anything (or
    says nothing), the answer is JSON; DefaultContentNegotiation reaches the same result
    after tokenising and ranking the Accept header (~40 µs of CPU). Another Accept value, a
    query string (``?format=``), a format suffix or several renderers go to DRF (406 included).
    Parser: the first parser, when the Content-Type is its media type verbatim, which is
    what DRF's parse-and-match loop returns too.
    """

    def select_parser(self, request: Any, parsers: list[BaseParser]) -> BaseParser | None:
        if parsers and request.content_type == parsers[0].media_type:
            return parsers[0]
        return super().select_parser(request, parsers)

    def select_renderer(
        self, request: Any, renderers: list[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        if format_suffix is None and len(renderers) == 1 and renderers[0].media_type == JSON:
            meta = getattr(request, "_request", request).META
            if not meta.get("QUERY_STRING") and meta.get("HTTP_ACCEPT", "*/*") in ("*/*", JSON):
                return renderers[0], JSON
        return super().select_renderer(request, renderers, format_suffix)
