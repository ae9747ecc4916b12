"""The API's JSON parser: DRF's, refusing what parses but cannot be fingerprinted or stored."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# The rules live at the bottom layer, shared with the DLQ's own parser of raw bodies.
from ledger.platform.storable import MAX_JSON_DEPTH, json_problem

__all__ = ["MAX_JSON_DEPTH", "BoundedJSONParser", "json_problem"]


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict[str, Any] | None = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON nested too deeply.") from exc
        problem = json_problem(data)
        if problem is not None:
            raise ParseError(problem)
        return data
