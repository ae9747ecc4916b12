"""Reading a reported failure: our envelope, n8n's Error Trigger payload (both variants) as
is, or anything else (stored raw and flagged). Pure functions, no database.

Identity (DESIGN §4), first that applies: an explicit ``event_id``;
``n8n:{workflow.id}:{execution.id}`` (``retryOf`` names the execution this one retried);
``n8n:{workflow.id}:trigger:{timestamp}:{node}`` for the trigger variant; else
``hmac:{key id}:{keyed digest of the raw body}``, flagged as a weak identity.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from dlq.models import FailedEventShape, KeySource
from ledger.models import ErrorClass
from ledger.platform.crypto import digest
from ledger.platform.errors import InvalidKey, MalformedJson, TimestampOutOfRange, ValidationFailed
from ledger.platform.storable import MAX_COUNT, NotStorable, loads, nul_problem, timestamp_problem
from ledger.protocol.services import sanitize_message
from ledger.rules.key_rules import key_check, key_usable

MAX_IDENTITY = 255
ENVELOPE_TYPE = "onceguard.failed_event"
_ENVELOPE_MARKERS = frozenset({"event_id", "idempotency_key", "key", "error", "error_message", "error_class", "source"})


@dataclass
class ParsedFailure:
    shape: str
    identity: str
    weak: bool
    payload: Any
    # Identity of the execution this report retried (n8n `retryOf`), if any.
    retry_of: str = ""
    error_message: str = ""
    error_class: str = ""
    failed_at: datetime | None = None
    original_key: str = ""
    replay_target_slug: str = ""
    retry_count: int = 0
    source: dict[str, str] = field(default_factory=dict)
    # Where original_key came from (dlq.models.KeySource) and, where it matters, why in words.
    key_source: str = ""
    key_note: str = ""
    # The failed request's headers that are kept (REQUEST_HEADERS_KEPT), lower-cased names.
    request_headers: dict[str, str] = field(default_factory=dict)
    # The failed item's index in the node's input, when the report names it (n8n's
    # error.context.itemIndex): lead capture then keeps only that item.
    item_index: int | None = None
    # True when the payload is the failed request's body (not the report).
    from_request: bool = False
    # The body field the workflow declared as its key (the report's top-level ``key_field``).
    key_field: str = ""
    # The report named its own event_id (one entry per reported event, never merged by key).
    explicit_identity: bool = False


def error_class_for_status(status: int) -> str:
    """DESIGN §3's table, for an HTTP status a receiver answered."""
    if 200 <= status < 300:
        return ""
    if status in (408, 425, 429, 503):
        return ErrorClass.TRANSIENT
    if status in (401, 403):
        return ErrorClass.PERMISSION
    if status >= 500:
        return ErrorClass.AMBIGUOUS
    return ErrorClass.INVALID_INPUT


# Network error codes that mean "never reached the receiver" vs "sent, answer lost".
_TRANSIENT_CODES = ("ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH")
_AMBIGUOUS_CODES = ("ETIMEDOUT", "ECONNRESET", "ESOCKETTIMEDOUT", "EPIPE", "ECONNABORTED")
_STATUS_IN_TEXT = re.compile(r"(?:\[(\d{3})\]|status code (\d{3})|\b(\d{3}) - )", re.IGNORECASE)


def error_class_from_report(*, message: str, http_code: Any = None) -> str:
    """Best effort for n8n errors, which carry no class: the HTTP code, else network codes."""
    code: int | None = None
    if isinstance(http_code, int) and not isinstance(http_code, bool):
        code = http_code
    elif isinstance(http_code, str) and re.fullmatch(r"[0-9]{3}", http_code.strip()):
        # ASCII digits only: str.isdigit() also says yes to "²" and to 5000-digit numbers,
        # which int() then refuses.
        code = int(http_code)
    else:
        found = _STATUS_IN_TEXT.search(message or "")
        if found:
            code = int(next(g for g in found.groups() if g))
    if code is not None and 100 <= code <= 599:
        return error_class_for_status(code)
    upper = (message or "").upper()
    if any(c in upper for c in _TRANSIENT_CODES):
        return ErrorClass.TRANSIENT
    if any(c in upper for c in _AMBIGUOUS_CODES) or "TIMEOUT" in upper or "TIMED OUT" in upper:
        return ErrorClass.AMBIGUOUS
    return ""


def weak_identity(raw: bytes) -> str:
    """A keyed HMAC of the raw body, never a bare hash: a tiny body (a phone number) could be
    guessed back from sha256 (DESIGN §6). After a key rotation the same body gets a new
    identity, so a repost across a rotation is a second (still weak, flagged) entry."""
    # latin-1 maps every byte to one character: any body, text or not, has a digest.
    kid, hexdigest = digest(raw.decode("latin-1"))
    return f"hmac:{kid}:{hexdigest}"


def _text(value: Any, limit: int = 255) -> str:
    if value is None or isinstance(value, (dict, list)):
        return ""
    return str(value).strip()[:limit]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _identity_part(value: Any) -> str:
    # ':' separates the parts; keep each part from smuggling one in.
    return _text(value, 80).replace(":", "_")


def _clip_identity(identity: str) -> str:
    if len(identity) <= MAX_IDENTITY:
        return identity
    return identity[: MAX_IDENTITY - 17] + "~" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def _parse_time(value: Any) -> datetime | None:
    """A reported failure time (epoch seconds or milliseconds, or ISO 8601); None when there
    is none or it cannot be read, and the entry takes its arrival time. A time that reads but
    lies outside ledger.platform.storable's window is refused: near year 1 or 9999 it overflows once
    shifted into a display time zone, and every list, page and export showing it would fail."""
    parsed: datetime | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = value / 1000 if value > 10_000_000_000 else value
            parsed = datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError) as exc:
            raise TimestampOutOfRange("The failure time is not a representable time.") from exc
    elif isinstance(value, str):
        try:
            parsed = parse_datetime(value)
        except ValueError:
            # Well formed but no date (month 13, offset of a day): unreadable, like "soon".
            return None
        if parsed is not None and parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
    if parsed is not None:
        problem = timestamp_problem(parsed)
        if problem is not None:
            raise TimestampOutOfRange(f"The failure time is out of range. {problem}")
    return parsed


# The failed request's headers an entry keeps (lower-cased): the content type and the key
# headers. Never Authorization, cookies or any other credential (`*-Key`, `*-Token`): a
# replay's credentials come from its replay target.
KEY_HEADERS = ("idempotency-key", "x-idempotency-key")
REQUEST_HEADERS_KEPT = ("content-type", *KEY_HEADERS)


@dataclass(frozen=True)
class FailedRequest:
    """What n8n's HTTP Request node reports of the request that failed
    (``execution.error.context.request``, n8n 1.x): its body and headers."""

    body: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class DerivedKey:
    key: str
    source: str
    note: str = ""


def _field_at(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def failed_request_key(
    *, headers: dict[str, str], body: Any, key_field: str = "", personal_data_allowed: bool = False
) -> DerivedKey:
    """The business key of a failed request, the one place it is derived (DESIGN §7,
    occurrences): its ``Idempotency-Key`` or ``X-Idempotency-Key`` header, else the body field
    the workflow declared (``key_field``, a dotted path; a string or a number). A key that is
    not a valid new key (ledger.rules.key_rules, with the tenant's ``personal_data_allowed`` waiver, as
    the API applies it) is no usable key; no key is ``source = missing`` with the reason in words.
    Never raises."""
    candidates: list[tuple[Any, str, str]] = [
        (headers.get(name), KeySource.REQUEST_HEADER, f"the {name} header") for name in KEY_HEADERS
    ]
    if key_field:
        candidates.append((_field_at(body, key_field), KeySource.REQUEST_FIELD, f"the field {key_field[:100]}"))
    refused: list[str] = []
    for value, source, where in candidates:
        if value is None or value == "" or isinstance(value, (bool, dict, list)):
            continue
        try:
            return DerivedKey(
                key_check(str(value), personal_data_allowed=personal_data_allowed),
                source,
                f"from {where}" if source == KeySource.REQUEST_FIELD else "",
            )
        except InvalidKey as exc:
            refused.append(f"{where} is no usable key ({exc.detail})")
    if refused:
        return DerivedKey("", KeySource.MISSING, "; ".join(refused)[:500])
    looked = "an Idempotency-Key or X-Idempotency-Key header"
    if key_field:
        looked += f" or the field {key_field[:100]}"
    else:
        looked += " (no key_field was declared)"
    return DerivedKey("", KeySource.MISSING, f"No business key: the failed request has no {looked}.")


def failed_request_of(error: dict[str, Any]) -> FailedRequest | None:
    """The failed request in an n8n error (``context.request``: body and headers), with only
    the headers an entry keeps; None when the error names no request."""
    request = _dict(_dict(error.get("context")).get("request"))
    if not request:
        return None
    headers = {
        # As sent (not stripped): a key with blanks around it is no usable key, not another key.
        str(name).lower(): str(value)[:1000]
        for name, value in _dict(request.get("headers")).items()
        if str(name).lower() in REQUEST_HEADERS_KEPT and isinstance(value, (str, int))
    }
    body = request.get("body")
    if body is None and "body" not in request:
        return None
    return FailedRequest(body=body, headers=headers)


def failed_item_index(report: Any) -> int | None:
    """The failed item's index an Error Trigger report names (``execution.error.context``)."""
    item = report[0] if isinstance(report, list) and len(report) == 1 else report
    return _item_index(_dict(_dict(_dict(item).get("execution")).get("error")))


def _item_index(error: dict[str, Any]) -> int | None:
    index = _dict(error.get("context")).get("itemIndex")
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index <= MAX_COUNT:
        return index
    return None


def _n8n_execution(body: dict[str, Any], raw: bytes) -> ParsedFailure:
    execution = _dict(body.get("execution"))
    workflow = _dict(body.get("workflow"))
    error = _dict(execution.get("error"))
    wf_id, exec_id = _identity_part(workflow.get("id")), _identity_part(execution.get("id"))
    retry_of = _identity_part(execution.get("retryOf"))
    message = sanitize_message(_text(error.get("message"), 2000))
    parsed = ParsedFailure(
        shape=FailedEventShape.N8N_EXECUTION,
        identity=f"n8n:{wf_id}:{exec_id}" if wf_id and exec_id else weak_identity(raw),
        weak=not (wf_id and exec_id),
        payload=body,
        retry_of=f"n8n:{wf_id}:{retry_of}" if wf_id and retry_of else "",
        error_message=message,
        error_class=error_class_from_report(message=message, http_code=error.get("httpCode")),
        source={
            "workflow_id": _text(workflow.get("id")),
            "workflow_name": _text(workflow.get("name")),
            "execution_id": _text(execution.get("id")),
            "execution_url": _text(execution.get("url"), 1000),
            "node": _text(execution.get("lastNodeExecuted")),
            "mode": _text(execution.get("mode"), 50),
        },
    )
    # An execution that is a retry shows that the source retried at least once.
    parsed.retry_count = 1 if parsed.retry_of else 0
    parsed.item_index = _item_index(error)
    request = failed_request_of(error)
    if request is not None:
        # The failed item's own request: the entry holds and replays only it, not the report
        # (which also carries the request's other headers) nor the items that succeeded.
        parsed.payload = request.body
        parsed.request_headers = request.headers
        parsed.from_request = True
    return parsed


def _n8n_trigger(body: dict[str, Any], raw: bytes) -> ParsedFailure:
    trigger = _dict(body.get("trigger"))
    workflow = _dict(body.get("workflow"))
    error = _dict(trigger.get("error"))
    node = _dict(error.get("node"))
    wf_id = _identity_part(workflow.get("id"))
    timestamp = _identity_part(error.get("timestamp"))
    node_name = _identity_part(node.get("name"))
    strong = bool(wf_id and timestamp and node_name)
    message = sanitize_message(_text(error.get("message"), 2000))
    cause = _dict(error.get("cause"))
    full_message = sanitize_message(
        f"{message}: {_text(cause.get('message'), 1000)}" if cause.get("message") else message
    )
    return ParsedFailure(
        shape=FailedEventShape.N8N_TRIGGER,
        identity=f"n8n:{wf_id}:trigger:{timestamp}:{node_name}" if strong else weak_identity(raw),
        weak=not strong,
        payload=body,
        error_message=full_message,
        error_class=error_class_from_report(message=full_message),
        failed_at=_parse_time(error.get("timestamp")),
        source={
            "workflow_id": _text(workflow.get("id")),
            "workflow_name": _text(workflow.get("name")),
            "node": _text(node.get("name")),
            "mode": _text(trigger.get("mode"), 50),
        },
    )


def _envelope(body: dict[str, Any], raw: bytes, *, personal_data_allowed: bool) -> ParsedFailure:
    source = _dict(body.get("source"))
    error = body.get("error")
    if isinstance(error, dict):
        message, error_class = error.get("message"), error.get("class") or error.get("error_class")
    else:
        message, error_class = (error if isinstance(error, str) else body.get("error_message")), None
    error_class = error_class or body.get("error_class") or ""
    if error_class not in ("", *ErrorClass.values):
        raise ValidationFailed(f"error_class must be one of {', '.join(ErrorClass.values)} (or omitted).")
    key = body.get("idempotency_key", body.get("key"))
    # Never a refusal: a key that breaks the key rule is stored as "no usable key".
    original_key = key_usable(key, personal_data_allowed=personal_data_allowed) if key not in (None, "") else ""
    event_id = body.get("event_id")
    if event_id not in (None, "") and (not isinstance(event_id, (str, int)) or len(str(event_id)) > MAX_IDENTITY):
        raise ValidationFailed(f"event_id must be a string of at most {MAX_IDENTITY} characters.")
    retry_count = body.get("retry_count", 0)
    if not isinstance(retry_count, int) or isinstance(retry_count, bool) or not 0 <= retry_count <= MAX_COUNT:
        raise ValidationFailed(f"retry_count must be an integer from 0 to {MAX_COUNT}.")
    wf_id, exec_id = _identity_part(source.get("workflow_id")), _identity_part(source.get("execution_id"))
    if event_id not in (None, ""):
        identity, weak = str(event_id).strip(), False
    elif wf_id and exec_id:
        # The same identity the n8n payload of that execution gets: both reports are one entry.
        identity, weak = f"n8n:{wf_id}:{exec_id}", False
    else:
        identity, weak = weak_identity(raw), True
    message = sanitize_message(_text(message, 2000))
    return ParsedFailure(
        shape=FailedEventShape.ENVELOPE,
        identity=identity,
        weak=weak,
        payload=body.get("payload"),
        error_message=message,
        error_class=error_class or error_class_from_report(message=message),
        failed_at=_parse_time(body.get("failed_at")),
        original_key=original_key,
        # An explicit event_id is the reporter's own identity of one failure (the node posts
        # one per item of a batch): its entry stays its own, whatever its key.
        key_source=(
            KeySource.IDENTITY
            if not original_key
            else KeySource.REPORTED_WITH_ID
            if event_id not in (None, "")
            else KeySource.REPORTED
        ),
        explicit_identity=event_id not in (None, ""),
        replay_target_slug=_text(body.get("replay_target"), 63),
        retry_count=retry_count,
        source={
            "workflow_id": _text(source.get("workflow_id")),
            "workflow_name": _text(source.get("workflow_name")),
            "execution_id": _text(source.get("execution_id")),
            "execution_url": _text(source.get("execution_url"), 1000),
            "node": _text(source.get("node")),
            "mode": _text(source.get("mode"), 50),
        },
    )


def _is_envelope(body: dict[str, Any]) -> bool:
    if body.get("type") == ENVELOPE_TYPE:
        return True
    return "payload" in body and bool(_ENVELOPE_MARKERS & body.keys())


def parse_failure(raw: bytes, *, personal_data_allowed: bool = False) -> ParsedFailure:
    """Recognise the shape of a reported failure; JSON of an unknown shape is kept raw.

    Refused (400), so that whatever is stored stays readable (ledger.platform.storable): a body that
    is empty, not UTF-8 or not JSON, or JSON that cannot be stored (too deep, non-finite
    numbers, integers over 4300 digits, lone surrogates) — ``malformed_json``; U+0000
    anywhere — ``validation_error``; a failure time out of range — ``timestamp_out_of_range``;
    and fields of our own envelope with the wrong type — ``validation_error``.

    ``personal_data_allowed`` is the tenant's waiver of the key rule's ``personal_data`` part
    (``Tenant.personal_data_in_keys_allowed``): a reported key the API would accept from this
    tenant is its entry's key, not "no usable key".
    """
    try:
        body: Any = loads(raw)
    except NotStorable as exc:
        raise MalformedJson(str(exc)) from exc
    nul = nul_problem(body)
    if nul is not None:
        raise ValidationFailed(nul)
    # n8n's HTTP Request node may send its items as a one-element list.
    item = body[0] if isinstance(body, list) and len(body) == 1 and isinstance(body[0], dict) else body
    if isinstance(item, dict):
        if isinstance(item.get("execution"), dict) and isinstance(item.get("workflow"), dict):
            parsed = _n8n_execution(item, raw)
        elif isinstance(item.get("trigger"), dict) and isinstance(item.get("workflow"), dict):
            parsed = _n8n_trigger(item, raw)
        elif _is_envelope(item):
            return _clip(_envelope(item, raw, personal_data_allowed=personal_data_allowed))
        else:
            parsed = ParsedFailure(shape=FailedEventShape.RAW, identity=weak_identity(raw), weak=True, payload=body)
        if not parsed.from_request:
            parsed.payload = body
        parsed.replay_target_slug = _text(item.get("replay_target"), 63)
        if parsed.shape == FailedEventShape.N8N_EXECUTION:
            _derive_key(
                parsed, key_field=_text(item.get("key_field"), 255), personal_data_allowed=personal_data_allowed
            )
        return _clip(parsed)
    return ParsedFailure(shape=FailedEventShape.RAW, identity=weak_identity(raw), weak=True, payload=body)


def _derive_key(parsed: ParsedFailure, *, key_field: str, personal_data_allowed: bool) -> None:
    """An Error Trigger report's key: the failed request's (failed_request_key). Without a
    request, the key is looked for later in the fetched item (lead capture) or stays missing."""
    if parsed.from_request:
        derived = failed_request_key(
            headers=parsed.request_headers,
            body=parsed.payload,
            key_field=key_field,
            personal_data_allowed=personal_data_allowed,
        )
        parsed.original_key, parsed.key_source, parsed.key_note = derived.key, derived.source, derived.note
    else:
        parsed.key_source = KeySource.MISSING
        parsed.key_note = "No business key: the report names no failed request (only HTTP Request nodes report theirs)."
    parsed.key_field = key_field


def _clip(parsed: ParsedFailure) -> ParsedFailure:
    parsed.identity = _clip_identity(parsed.identity)
    if parsed.retry_of:
        parsed.retry_of = _clip_identity(parsed.retry_of)
    return parsed
