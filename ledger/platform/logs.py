"""Logs: one pipeline (structlog over std logging) for our lines, Django's and django-q2's.

``LOG_FORMAT=json`` writes one JSON object per line for a log pipeline; anything else keeps
the readable ``<time> <LEVEL> <logger> <event> key=value …`` lines. Both come out of the
same processors:

1. std-logging lines written as ``"event key=%s attempt=%s"`` (every module's habit) are
   split into an event name and fields, so JSON consumers get ``{"event": …, "key": …}``;
2. fields bound with :func:`log_context` (tenant, key, attempt, provider, workflow and
   execution ids, …) are added to every line written inside the block, in any module;
3. a redaction processor masks e-mail addresses, phone numbers, bearer tokens, API keys and
   known payload field names. It is the second line of defence: code never logs payloads
   (DESIGN §7); this catches the slip.

This module imports no app but ledger.platform.redaction (which imports none), so any layer may import
its helpers.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

# One pattern set for log lines and stored error text, at the bottom layer.
from ledger.platform.redaction import REDACTED, redact_text
from ledger.platform.redaction import SUSPECT as _SUSPECT

# Field names whose values are payload or credentials, wherever they appear (a bound
# field, a `name=value` in a message, a key in a nested dict).
REDACTED_FIELDS = frozenset(
    {
        "payload",
        "request",
        "request_body",
        "response",
        "response_body",
        "body",
        "headers",
        "email",
        "phone",
        "phone_number",
        "mobile",
        "first_name",
        "last_name",
        "full_name",
        "address",
        "transcript",
        "password",
        "secret",
        "token",
        "api_key",
        "authorization",
        "cookie",
    }
)
# Fields that hold identifiers: never turned into numbers, so a key "1001" stays a string
# in JSON and a pipeline's field type does not flip between lines.
STRING_FIELDS = frozenset(
    {
        "key",
        "ref",
        "provider",
        "provider_ref",
        "handle",
        "tenant",
        "execution_id",
        "correlation_id",
        "workflow_id",
        "workflow_version",
        # A render job's labels (ADR 0016): "3" stays text, as on a line where it is "".
        "preset_version",
        "aspect_class",
        "event_id",
        "name",
        "path",
    }
)
# Fields written by the pipeline itself; redaction leaves them alone.
_OWN_FIELDS = frozenset({"timestamp", "level", "logger"})
_RESERVED = _OWN_FIELDS | {"event", "exception"}

# `event name=value name=value` as written by `log.info("event key=%s …", …)`.
_KV_MESSAGE = re.compile(r"^([a-z][a-z0-9_.]*)((?: [A-Za-z_][A-Za-z0-9_]*=.*)?)$", re.DOTALL)
_KV_PAIR = re.compile(r" ([A-Za-z_][A-Za-z0-9_]*)=(.*?)(?= [A-Za-z_][A-Za-z0-9_]*=|$)", re.DOTALL)
_INT = re.compile(r"^-?\d{1,18}$")
_FLOAT = re.compile(r"^-?\d+\.\d+$")


# --- Binding fields ------------------------------------------------------------------------


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line written inside the block (this thread or task only).

    Empty values (None, "") are left out. Typical use, around one operation's work::

        with log_context(**operation_fields(op, provider=provider.slug)):
            ...
    """
    present = {name: value for name, value in fields.items() if value is not None and value != ""}
    with structlog.contextvars.bound_contextvars(**present):
        yield


def bound_log_fields() -> dict[str, Any]:
    """The fields ``log_context`` has bound around the current code (this thread or task)."""
    return dict(structlog.contextvars.get_contextvars())


def operation_fields(operation: Any, **extra: Any) -> dict[str, Any]:
    """The fields every line about an operation carries, read from an ``Operation`` (or any
    object with its attributes) without touching the database; ``extra`` adds or overrides
    (``provider="stripe"`` for the slug, ``duration_ms=…``, ``error_class=…``)."""
    fields: dict[str, Any] = {
        "tenant": getattr(operation, "tenant_id", None),
        "operation": getattr(operation, "pk", None),
        "key": getattr(operation, "key", None),
        "attempt": getattr(operation, "attempts", None),
        "provider": getattr(operation, "provider_id", None),
        "provider_ref": getattr(operation, "provider_ref", None),
        "error_class": getattr(operation, "error_class", None),
        "workflow_id": getattr(operation, "workflow_id", None),
        "workflow_version": getattr(operation, "workflow_version", None),
        "execution_id": getattr(operation, "execution_id", None),
        "correlation_id": getattr(operation, "correlation_id", None),
    }
    fields.update(extra)
    return {name: value for name, value in fields.items() if value is not None and value != ""}


def get_logger(name: str) -> Any:
    """A structlog logger writing through std logging under ``name`` (e.g. "onceguard.x"):
    ``get_logger("onceguard.x").info("thing_done", key=key, duration_ms=12)``."""
    return structlog.stdlib.get_logger(name)


# --- Processors ----------------------------------------------------------------------------


def _typed(name: str, value: str) -> Any:
    if name in STRING_FIELDS:
        return value
    if value == "None":
        return None
    if _INT.match(value):
        return int(value)
    if _FLOAT.match(value):
        return float(value)
    return value


def split_kv_message(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Turn a std-logging ``"event key=value …"`` message into an event and fields.

    Fields from the message win over bound context (they are the more specific). A message
    of another shape (Django's "Not Found: /x") stays whole in ``event``.
    """
    if event_dict.get("_from_structlog"):
        return event_dict
    message = event_dict.get("event")
    if not isinstance(message, str):
        return event_dict
    match = _KV_MESSAGE.match(message)
    if match is None:
        return event_dict
    event_dict["event"] = match.group(1)
    for pair in _KV_PAIR.finditer(match.group(2)):
        name = pair.group(1)
        # A message field named like a line's own key (the DLQ's `event=<id>`) gets a
        # trailing underscore, the way Python spells `class_`.
        event_dict[f"{name}_" if name in _RESERVED else name] = _typed(name, pair.group(2))
    return event_dict


def _redact_value(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if depth > 8:
        return REDACTED
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if str(k).lower() in REDACTED_FIELDS else _redact_value(v, depth + 1))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set):
        return [_redact_value(v, depth + 1) for v in value]
    return value


def redact(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Second line of defence: mask payload-looking values before anything is rendered."""
    texts = []
    for name, value in event_dict.items():
        if name in _OWN_FIELDS or name.startswith("_"):
            continue
        if name.lower() in REDACTED_FIELDS:
            event_dict[name] = REDACTED
        elif isinstance(value, str):
            texts.append(value)
        elif not isinstance(value, int | float | bool) and value is not None:
            event_dict[name] = _redact_value(value)
    # One screen over all the line's text: most lines hold nothing worth a closer look.
    if texts and _SUSPECT.search("\n".join(texts)):
        for name, value in event_dict.items():
            if isinstance(value, str) and name not in _OWN_FIELDS and not name.startswith("_"):
                event_dict[name] = redact_text(value)
    return event_dict


# The head of every line, then an operation's fields in one order (bound context comes out
# of contextvars in no particular order).
_FIRST = (
    "timestamp",
    "level",
    "logger",
    "event",
    "tenant",
    "operation",
    "key",
    "attempt",
    "provider",
    "provider_ref",
    "error_class",
    "workflow_id",
    "workflow_version",
    "execution_id",
    "correlation_id",
    "duration_ms",
)


def _order(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """The same field order on every line: head, operation fields, then the rest."""
    head = {k: event_dict.pop(k) for k in _FIRST if k in event_dict}
    head.update(event_dict)
    return head


_PLAIN_VALUE = re.compile(r"^[^\s\"=\\]*$")


def _kv_value(value: Any) -> str:
    if isinstance(value, int | float) or value is None:
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if text and _PLAIN_VALUE.match(text) else json.dumps(text)


class KeyValueRenderer:
    """``<time> <LEVEL> <logger> <event> key=value …``: today's readable lines; a value with
    spaces, quotes or ``=`` is written as a JSON string so the line still splits cleanly."""

    def __call__(self, _logger: WrappedLogger, _name: str, event_dict: EventDict) -> str:
        head = " ".join(str(event_dict.pop(k, "-")) for k in ("timestamp", "level", "logger", "event"))
        exception = event_dict.pop("exception", None)
        fields = " ".join(f"{name}={_kv_value(value)}" for name, value in event_dict.items())
        line = f"{head} {fields}" if fields else head
        return f"{line}\n{exception}" if exception else line


def _upper_level(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    if "level" in event_dict:
        event_dict["level"] = str(event_dict["level"]).upper()
    return event_dict


_EXTRA_ADDER = structlog.stdlib.ExtraAdder()
# Set on a record by std-logging formatters, not by the caller: another handler that
# formatted the record first must not add them as fields.
_FORMATTER_ATTRIBUTES = ("message", "asctime")


def add_extra(logger: WrappedLogger, name: str, event_dict: EventDict) -> EventDict:
    """Fields passed with ``extra={...}`` (Django passes ``status_code``, ``request``)."""
    present = {k for k in _FORMATTER_ATTRIBUTES if k in event_dict}
    event_dict = _EXTRA_ADDER(logger, name, event_dict)
    for k in _FORMATTER_ATTRIBUTES:
        if k not in present:
            event_dict.pop(k, None)
    return event_dict


# Run on every line, ours (structlog) and foreign (std logging: Django, django-q2, ours
# written with logging.getLogger).
_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    add_extra,
    structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
]


def formatter_processors(fmt: str) -> list[Processor]:
    """What a ProcessorFormatter runs after the shared chain, for ``json`` or ``kv``."""
    tail: list[Processor] = [
        split_kv_message,
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.processors.format_exc_info,
        redact,
        _order,
    ]
    if fmt == "json":
        return [*tail, structlog.processors.JSONRenderer(default=str)]
    return [*tail, _upper_level, KeyValueRenderer()]


def formatter(fmt: str = "kv") -> logging.Formatter:
    """A std-logging formatter rendering like the configured handlers (tests use it)."""
    return structlog.stdlib.ProcessorFormatter(processors=formatter_processors(fmt), foreign_pre_chain=_SHARED)


def logging_config(*, level: str = "INFO", fmt: str = "kv", q_level: str = "WARNING") -> dict[str, Any]:
    """Django's LOGGING for ``fmt`` ("json" or "kv"), and structlog set to write through it."""
    fmt = "json" if fmt.strip().lower() == "json" else "kv"
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processors": formatter_processors(fmt),
                "foreign_pre_chain": _SHARED,
            }
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {
            "onceguard": {"handlers": ["console"], "level": level, "propagate": False},
            # The access log's head, witnessed outside the database (review.audit.accesslog): kept
            # whatever LOG_LEVEL says, since `accesslog_verify --log` reads these lines back.
            "onceguard.accesslog.witness": {"level": "INFO"},
            "django.request": {"handlers": ["console"], "level": "ERROR", "propagate": False},
            # django-q2 adds its own handler only when none is reachable: ours is (root).
            "django-q": {"level": q_level},
        },
    }
