"""The fast negotiation answers exactly what DRF's DefaultContentNegotiation answers."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from config.negotiation import JsonFastNegotiation

ACCEPTS = [
    None,
    "*/*",
    "application/json",
    "application/json; indent=4",
    "application/*",
    "text/html",
    "text/html, application/json;q=0.9",
    "application/problem+json",
    "",
    "APPLICATION/JSON",
    " application/json",
]


def answer(negotiation: Any, request: Request, renderers: list[Any], suffix: str | None) -> Any:
    try:
        renderer, media_type = negotiation.select_renderer(request, renderers, suffix)
    except NotAcceptable:
        return "406"
    return type(renderer), media_type


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("query", ["", "?format=json", "?format=api", "?page=2"])
@pytest.mark.parametrize("renderer_classes", [[JSONRenderer], [JSONRenderer, BrowsableAPIRenderer]])
@pytest.mark.parametrize("suffix", [None, "json"])
def test_fast_and_default_negotiation_agree(accept, query, renderer_classes, suffix):
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(APIRequestFactory().post("/api/v1/claims" + query, **headers))
    renderers = [cls() for cls in renderer_classes]

    try:
        expected = answer(DefaultContentNegotiation(), request, renderers, suffix)
    except Exception as exc:  # e.g. Http404 for an unknown ?format=
        with pytest.raises(type(exc)):
            answer(JsonFastNegotiation(), request, renderers, suffix)
        return
    assert answer(JsonFastNegotiation(), request, renderers, suffix) == expected


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain", "application/*", ""],
)
def test_fast_and_default_parser_selection_agree(content_type):
    from rest_framework.parsers import FormParser, JSONParser

    request = Request(APIRequestFactory().generic("POST", "/api/v1/claims", b"{}", content_type=content_type))
    for parsers in ([JSONParser()], [FormParser(), JSONParser()], []):
        assert JsonFastNegotiation().select_parser(request, parsers) is DefaultContentNegotiation().select_parser(
            request, parsers
        )
