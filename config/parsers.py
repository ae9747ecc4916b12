"""The API's JSON parser: DRF's, refusing what parses but cannot be fingerprinted or stored."""

from __future__ import annotations

import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Deeper than any real request; far below the interpreter's recursion limit, so parsing,
# fingerprinting (canonical JSON) and storing a body can never raise RecursionError (a 500).
MAX_JSON_DEPTH = 64


def json_problem(value: Any) -> str | None:
    """Why a parsed JSON value cannot be stored, or None. Walked without recursion.

    json.loads accepts numbers that overflow to infinity (1e400) and lone surrogate escapes
    ("\\ud800"); neither can be written back as JSON or UTF-8 (jsonb, encryption, logs).
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
            stack.extend((k, depth) for k in item.keys())
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > MAX_JSON_DEPTH:
                return f"JSON nested deeper than {MAX_JSON_DEPTH} levels."
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, float) and not math.isfinite(item):
            return "JSON numbers must be finite."
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "JSON strings must be valid Unicode (no lone surrogates)."
    return None


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
