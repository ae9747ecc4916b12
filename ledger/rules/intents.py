"""Intent envelopes (DESIGN §5, intents): what a submission may say, and how an adapter
revision's request template turns it into the provider's request.

A provider with an **intent schema** takes submissions that carry ``intent`` — named, typed,
bounded values (``preset_id``, ``aspect_class``, an upload by key and digest, free-text slots)
— instead of a request. The provider's field names, model ids and size syntax live only in the
**request template** of its adapter revision, which is data a tenant writes: a JSON document
in which a string that is exactly ``{{ name }}`` becomes the named value (typed: a number stays
a number) and ``{{ name }}`` inside a longer string is replaced by the value's text. Nothing is
evaluated: no expressions, no attribute access, no filters, no loops; a value is substituted
once and never read again as a template. Anything else in braces is refused when the
template is saved. ``lookups`` map every value of an enum field to the provider's own
spelling (``square`` → ``1024x1024``), so nothing is ever rounded to a near value, and
``{{ prompt:name }}`` (or ``{{ prompt:name@3 }}``) places a server-side prompt template whose
slots take the user's text fenced (ledger.providers.prompts).

Plain values in, messages or named errors out: no models, no database (ledger.models and
ledger.execution.translation call this module; the prompt and upload look-ups are passed in).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ledger.platform.errors import DomainError, ValidationFailed

FIELD_TYPES = ("string", "integer", "number", "boolean", "enum", "upload")
TEMPLATE_PARTS = ("method", "path", "query", "headers", "body", "lookups")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
NAME = r"[a-z][a-z0-9_]{0,62}"
PROMPT_NAME = r"[a-z0-9][a-z0-9_-]{0,62}"
_NAME = re.compile(NAME)
# One placeholder: a value's name, or a prompt template by name and optional version. Spaces
# inside the braces are allowed; nothing else is.
PLACEHOLDER = re.compile(
    r"\{\{[ \t]*(?:prompt:(?P<prompt>"
    + PROMPT_NAME
    + r")(?:@(?P<version>[1-9][0-9]{0,8}))?|(?P<name>"
    + NAME
    + r"))[ \t]*\}\}"
)
_BRACED = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}|\$\{.*?\}", re.S)
UPLOAD_KEY = re.compile(r"up_[0-9a-f]{64}")
SHA256 = re.compile(r"[0-9a-f]{64}")

MAX_FIELDS = 100
MAX_ENUM_VALUES = 500
MAX_TEXT_LENGTH = 20_000
MAX_CONFIG_BYTES = 64 * 1024
MAX_DEPTH = 20


class IntentInvalid(DomainError):
    """A value of the wrong type, out of its range or length, or a required one missing."""

    code, title = "intent_invalid", "Intent not valid"


class IntentUnknownField(DomainError):
    code, title = "intent_unknown_field", "Unknown intent field"


class IntentValueNotAllowed(DomainError):
    """An enum value the schema does not list: refused, never rounded to a near one."""

    code, title = "intent_value_not_allowed", "Intent value not allowed"


class IntentRequired(DomainError):
    code, title = "intent_required", "This provider takes an intent, not a request"


class IntentNotAccepted(DomainError):
    code, title = "intent_not_accepted", "This provider takes a request, not an intent"


class UploadReferenceInvalid(DomainError):
    """No upload of this tenant with this key and digest (another tenant's is the same answer)."""

    code, title = "upload_reference_invalid", "Upload reference not valid"


class RequestTemplateInvalid(ValidationFailed):
    """An intent schema or request template refused when saved (an expression, an unknown
    name, an enum value without its lookup, …)."""

    code, title = "request_template_invalid", "Intent schema or request template not valid"


# --- The schema --------------------------------------------------------------------------------


def _fields(schema: Any) -> dict[str, dict[str, Any]]:
    return dict((schema or {}).get("fields") or {}) if isinstance(schema, dict) else {}


def upload_members(name: str) -> tuple[str, str]:
    """What an upload field ``name`` is sent as, and named in a template: its key and digest."""
    return f"{name}_key", f"{name}_sha256"


def member_names(schema: Any) -> list[str]:
    """The names an intent of ``schema`` may carry (an upload field is two of them)."""
    names: list[str] = []
    for name, spec in _fields(schema).items():
        # A spec that is not an object is schema_problems' to name, not a crash here.
        is_upload = isinstance(spec, dict) and spec.get("type") == "upload"
        names.extend(upload_members(name) if is_upload else (name,))
    return names


def _bounded_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _field_problems(name: str, spec: Any) -> list[str]:
    where = f"intent_schema field {name!r}"
    if not _NAME.fullmatch(str(name)):
        return [f"{where}: a name is lower case letters, digits and _, starting with a letter (at most 63)."]
    if not isinstance(spec, dict):
        return [f"{where} must be an object with a type."]
    kind = spec.get("type")
    allowed = {"type", "required", "description"}
    problems: list[str] = []
    if kind not in FIELD_TYPES:
        return [f"{where}: type must be one of {', '.join(FIELD_TYPES)}."]
    if not isinstance(spec.get("required", False), bool):
        problems.append(f"{where}: required is true or false.")
    if not isinstance(spec.get("description", ""), str):
        problems.append(f"{where}: description is text.")
    if kind == "string":
        allowed |= {"max_length", "min_length"}
        top = spec.get("max_length")
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TEXT_LENGTH:
            problems.append(f"{where}: a string needs max_length, a whole number from 1 to {MAX_TEXT_LENGTH}.")
        low = spec.get("min_length", 0)
        if isinstance(low, bool) or not isinstance(low, int) or low < 0 or (isinstance(top, int) and low > top):
            problems.append(f"{where}: min_length is a whole number no larger than max_length.")
    elif kind in ("integer", "number"):
        allowed |= {"min", "max"}
        for bound in ("min", "max"):
            if bound in spec and not (
                _bounded_number(spec[bound]) and (kind == "number" or isinstance(spec[bound], int))
            ):
                problems.append(f"{where}: {bound} must be a finite {kind}.")
        if not problems and "min" in spec and "max" in spec and spec["min"] > spec["max"]:
            problems.append(f"{where}: min is larger than max.")
    elif kind == "enum":
        allowed |= {"values"}
        values = spec.get("values")
        if (
            not isinstance(values, list)
            or not 1 <= len(values) <= MAX_ENUM_VALUES
            or not all(isinstance(v, str) and 0 < len(v) <= 200 and v.isprintable() for v in values)
            or len(set(values)) != len(values)
        ):
            problems.append(
                f"{where}: an enum needs values, a list of 1 to {MAX_ENUM_VALUES} different printable strings."
            )
    unknown = set(spec) - allowed
    if unknown:
        problems.append(f"{where}: unknown keys {', '.join(sorted(map(str, unknown)))}.")
    return problems


def schema_problems(schema: Any) -> list[str]:
    """Why ``schema`` is not a valid intent schema (empty: it is)."""
    if not isinstance(schema, dict) or set(schema) - {"fields"} or not isinstance(schema.get("fields"), dict):
        return ['intent_schema must be {"fields": {name: {"type": …}, …}}.']
    fields = schema["fields"]
    if not 1 <= len(fields) <= MAX_FIELDS:
        return [f"intent_schema declares 1 to {MAX_FIELDS} fields."]
    problems = [p for name, spec in fields.items() for p in _field_problems(name, spec)]
    if problems:
        return problems
    names = member_names(schema)
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        problems.append(
            f"intent_schema: the names {', '.join(clashes)} are declared twice (an upload field f is sent as f_key and f_sha256)."
        )
    return problems


# --- The template ------------------------------------------------------------------------------


def _walk(value: Any, where: str, depth: int = 0) -> Iterator[tuple[str, str, bool]]:
    """Every string of a JSON document: (where, text, is a key)."""
    if depth > MAX_DEPTH:
        raise RequestTemplateInvalid(f"{where}: nested deeper than {MAX_DEPTH} levels.")
    if isinstance(value, str):
        yield where, value, False
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where}.{k}", str(k), True
            yield from _walk(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{where}[{i}]", depth + 1)


def _brace_problem(where: str, text: str, *, is_key: bool) -> str | None:
    """Why the braces in ``text`` are refused (None: every brace is a placeholder)."""
    if is_key:
        return (
            f"{where}: an object key is literal; braces are not allowed in it." if "{" in text or "}" in text else None
        )
    rest = PLACEHOLDER.sub("", text)
    if "{" not in rest and "}" not in rest:
        return None
    bad = (
        next((m.group(0) for m in _BRACED.finditer(rest)), None)
        or rest[rest.find("{") if "{" in rest else rest.find("}") :][:40]
    )
    return (
        f"{where}: {bad[:60]!r} is not a placeholder. A template substitutes named values only —"
        " {{ name }} or {{ prompt:name }} —; expressions, attribute access, filters and other braces are refused."
    )


@dataclass(frozen=True)
class Reference:
    """What a template's placeholders name."""

    names: frozenset[str]
    # (prompt name, version or None)
    prompts: frozenset[tuple[str, int | None]]


def template_references(template: Any) -> Reference:
    names: set[str] = set()
    prompts: set[tuple[str, int | None]] = set()
    for part in ("method", "path", "query", "headers", "body"):
        for _where, text, is_key in _walk(template.get(part), part):
            if is_key:
                continue
            for match in PLACEHOLDER.finditer(text):
                if match.group("prompt"):
                    version = match.group("version")
                    prompts.add((match.group("prompt"), int(version) if version else None))
                else:
                    names.add(match.group("name"))
    return Reference(frozenset(names), frozenset(prompts))


def template_problems(
    template: Any, schema: Any, *, prompt_slots: Callable[[str, int | None], dict[str, Any] | None]
) -> list[str]:
    """Why ``template`` cannot translate intents of ``schema`` (empty: it can). ``prompt_slots``
    answers a prompt template's declared slots by name and version (None: no such prompt)."""
    if not isinstance(template, dict):
        return ['request_template must be an object: {"method", "path", "query", "headers", "body", "lookups"}.']
    unknown = set(template) - set(TEMPLATE_PARTS)
    if unknown:
        return [
            f"request_template: unknown parts {', '.join(sorted(map(str, unknown)))} (allowed: {', '.join(TEMPLATE_PARTS)})."
        ]
    if len(json.dumps(template, ensure_ascii=False)) > MAX_CONFIG_BYTES:
        return [f"request_template is larger than {MAX_CONFIG_BYTES} bytes."]
    problems: list[str] = []
    method = template.get("method", "POST")
    if method not in METHODS:
        problems.append(f"request_template.method is one of {', '.join(METHODS)}, written out (no placeholder).")
    path = template.get("path", "/")
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("//"):
        problems.append("request_template.path is an absolute path below the provider's base URL.")
    for part in ("query", "headers"):
        if part in template and not isinstance(template[part], dict):
            problems.append(f"request_template.{part} must be an object.")
    if isinstance(template.get("headers"), dict) and not all(isinstance(v, str) for v in template["headers"].values()):
        problems.append("request_template.headers values are strings.")
    try:
        for part in ("method", "path", "query", "headers", "body"):
            for where, text, is_key in _walk(template.get(part), f"request_template.{part}"):
                problem = _brace_problem(where, text, is_key=is_key)
                if problem:
                    problems.append(problem)
    except RequestTemplateInvalid as exc:
        problems.append(exc.detail)
    if problems:
        return problems
    fields = _fields(schema)
    lookups = template.get("lookups") or {}
    available: set[str] = set(member_names(schema))
    if not isinstance(lookups, dict):
        return ['request_template.lookups must map names to {"field": enum field, "values": {…}}.']
    for name, spec in lookups.items():
        where = f"request_template.lookups.{name}"
        if not _NAME.fullmatch(str(name)) or name in available:
            problems.append(f"{where}: a lookup's name is a new name (lower case, digits, _), not an intent field's.")
            continue
        if not isinstance(spec, dict) or set(spec) != {"field", "values"} or not isinstance(spec.get("values"), dict):
            problems.append(f'{where} must be {{"field": an enum field, "values": {{each value: what to send}}}}.')
            continue
        field = fields.get(spec["field"]) if isinstance(spec["field"], str) else None
        if not field or field.get("type") != "enum":
            problems.append(f"{where}: field must name an enum field of the intent schema.")
            continue
        missing = [v for v in field["values"] if v not in spec["values"]]
        extra = [v for v in spec["values"] if v not in field["values"]]
        if missing or extra:
            # Every allowed value has exactly one translation: none is sent as a near one.
            problems.append(
                f"{where} must translate exactly the values of {spec['field']!r}"
                + (f"; missing {', '.join(map(repr, missing[:10]))}" if missing else "")
                + (f"; not allowed {', '.join(map(repr, extra[:10]))}" if extra else "")
                + "."
            )
        available.add(name)
    references = template_references(template)
    for name in sorted(references.names - available):
        problems.append(f"request_template names {{{{ {name} }}}}, which is neither an intent field nor a lookup.")
    # User text goes only into a prompt template's declared slot, fenced (DESIGN §5): a free-text
    # field placed in the request itself would reach the provider beside the instructions,
    # unfenced. Identifiers a request needs are enums, numbers or uploads.
    for name in sorted(n for n in references.names if fields.get(n, {}).get("type") == "string"):
        problems.append(
            f"request_template places the free-text field {name!r} directly; user text goes only into a prompt"
            " template's slot ({{ prompt:name }}), where it is fenced. Use an enum for a value the request needs."
        )
    if len({name for name, _ in references.prompts}) > 1 or len(references.prompts) > 1:
        problems.append("request_template places at most one prompt template.")
    for name, version in sorted(references.prompts, key=lambda p: (p[0], p[1] or 0)):
        slots = prompt_slots(name, version)
        label = f"{name}@{version}" if version else name
        if slots is None:
            problems.append(f"request_template names the prompt template {label!r}, which does not exist.")
            continue
        strings = {n for n, spec in fields.items() if spec.get("type") in ("string", "enum")}
        for slot in sorted(set(slots) - strings):
            problems.append(
                f"prompt template {label!r} has the slot {slot!r}, which is not a string or enum field of the intent schema."
            )
    return problems


def intent_config_errors(
    *, intent_schema: Any, request_template: Any, prompt_slots: Callable[[str, int | None], dict[str, Any] | None]
) -> dict[str, str]:
    """Field → message for a provider's intent configuration (empty: it is valid). Both are
    set or neither: a schema without a translation could accept work nothing can send."""
    if intent_schema in (None, {}) and request_template in (None, {}):
        return {}
    if intent_schema in (None, {}):
        return {"intent_schema": "A request template translates an intent schema: declare the schema too."}
    problems = schema_problems(intent_schema)
    if problems:
        return {"intent_schema": " ".join(problems)}
    if request_template in (None, {}):
        return {"request_template": "An intent schema needs a request template that translates it."}
    problems = template_problems(request_template, intent_schema, prompt_slots=prompt_slots)
    return {"request_template": " ".join(problems)} if problems else {}


# --- A submission's intent ----------------------------------------------------------------------


@dataclass(frozen=True)
class UploadRef:
    field: str
    key: str
    sha256: str


@dataclass(frozen=True)
class ValidIntent:
    values: dict[str, Any]
    uploads: tuple[UploadRef, ...]


def _value_problem(name: str, spec: dict[str, Any], value: Any) -> DomainError | None:
    kind = spec["type"]
    extra = {"field": name}
    if kind == "string":
        if not isinstance(value, str):
            return IntentInvalid(f"intent.{name} must be a string.", extra=extra)
        if "\x00" in value:
            return IntentInvalid(f"intent.{name} may not contain U+0000.", extra=extra)
        if not spec.get("min_length", 0) <= len(value) <= spec["max_length"]:
            return IntentInvalid(
                f"intent.{name} must be {spec.get('min_length', 0)} to {spec['max_length']} characters long.",
                extra={**extra, "max_length": spec["max_length"]},
            )
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return IntentInvalid(f"intent.{name} must be a whole number.", extra=extra)
    elif kind == "number":
        if not _bounded_number(value):
            return IntentInvalid(f"intent.{name} must be a finite number.", extra=extra)
    elif kind == "boolean":
        if not isinstance(value, bool):
            return IntentInvalid(f"intent.{name} must be true or false.", extra=extra)
    elif kind == "enum":
        if not isinstance(value, str) or value not in spec["values"]:
            shown = value if isinstance(value, str) else json.dumps(value)[:40]
            return IntentValueNotAllowed(
                f"intent.{name} is {shown[:60]!r}, which is not one of its allowed values.",
                extra={**extra, "allowed": list(spec["values"])},
            )
    if kind in ("integer", "number"):
        low, high = spec.get("min"), spec.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            return IntentInvalid(
                f"intent.{name} must lie between {low if low is not None else '-∞'} and {high if high is not None else '∞'}.",
                extra=extra,
            )
    return None


def intent_validate(schema: Any, intent: Any) -> ValidIntent:
    """``intent`` checked against ``schema``: the values as stored (absent and null members
    left out) and its upload references (their existence is the caller's to check). Raises
    the named error of the first problem; nothing is coerced, trimmed or rounded."""
    if not isinstance(intent, dict):
        raise IntentInvalid("`intent` must be an object of named values.")
    fields = _fields(schema)
    allowed = member_names(schema)
    unknown = sorted(str(name) for name in intent if name not in allowed)
    if unknown:
        raise IntentUnknownField(
            f"intent has fields the provider's intent schema does not declare: {', '.join(unknown[:10])}.",
            extra={"fields": unknown[:10], "allowed": allowed},
        )
    values: dict[str, Any] = {}
    uploads: list[UploadRef] = []
    for name, spec in fields.items():
        if spec["type"] == "upload":
            key_name, sha_name = upload_members(name)
            key, sha = intent.get(key_name), intent.get(sha_name)
            if key is None and sha is None:
                if spec.get("required"):
                    raise IntentInvalid(f"intent.{key_name} and intent.{sha_name} are required.", extra={"field": name})
                continue
            if not (
                isinstance(key, str) and UPLOAD_KEY.fullmatch(key) and isinstance(sha, str) and SHA256.fullmatch(sha)
            ):
                raise UploadReferenceInvalid(
                    f"intent.{key_name} must be an upload key (up_ + 64 hex) and intent.{sha_name} its sha256 (64 lower-case hex).",
                    extra={"field": name},
                )
            values[key_name], values[sha_name] = key, sha
            uploads.append(UploadRef(field=name, key=key, sha256=sha))
            continue
        value = intent.get(name)
        if value is None:
            if spec.get("required"):
                raise IntentInvalid(f"intent.{name} is required.", extra={"field": name})
            continue
        problem = _value_problem(name, spec, value)
        if problem is not None:
            raise problem
        values[name] = value
    return ValidIntent(values=values, uploads=tuple(uploads))


# --- Rendering ----------------------------------------------------------------------------------


def value_text(value: Any) -> str:
    """A value as text inside a longer string: a string as it is, true/false, numbers as JSON,
    nothing as the empty string, an object (a lookup's) as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Rendered:
    request: dict[str, Any]
    # The prompt template placed, as the resolver returned it (None: the template names none).
    prompt: Any = None


def template_render(
    template: dict[str, Any],
    values: dict[str, Any],
    *,
    prompt_text: Callable[[str, int | None, dict[str, Any]], tuple[str, Any]],
) -> Rendered:
    """The provider's request for ``values`` (a valid intent's): one pass over the template,
    every placeholder replaced by its value and never read again. ``prompt_text(name, version,
    values)`` answers a prompt template's filled text and the row it used. Text placed in the
    path is percent-encoded whole (a value cannot add a segment, a query or a fragment)."""
    names = dict(values)
    for name, spec in (template.get("lookups") or {}).items():
        chosen = values.get(spec["field"])
        names[name] = spec["values"].get(chosen) if chosen is not None else None
    used: list[Any] = []

    def resolve(match: re.Match[str]) -> Any:
        if match.group("prompt"):
            version = match.group("version")
            text, row = prompt_text(match.group("prompt"), int(version) if version else None, values)
            used.append(row)
            return text
        return names.get(match.group("name"))

    def fill(value: Any, *, in_path: bool = False) -> Any:
        if isinstance(value, str):
            whole = PLACEHOLDER.fullmatch(value)
            if whole and not in_path:
                return resolve(whole)
            encode = (lambda t: quote(t, safe="")) if in_path else (lambda t: t)
            return PLACEHOLDER.sub(lambda m: encode(value_text(resolve(m))), value)
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    request: dict[str, Any] = {
        "method": template.get("method", "POST"),
        "path": fill(template.get("path", "/"), in_path=True),
    }
    for part in ("query", "headers", "body"):
        if part in template:
            request[part] = fill(template[part])
    if "headers" in request:
        request["headers"] = {k: value_text(v) for k, v in request["headers"].items()}
    return Rendered(request=request, prompt=used[0] if used else None)


def is_intent(stored: Any) -> bool:
    """Whether a submitted execute-mode request is an intent envelope (``{"intent": {…}}``)."""
    return isinstance(stored, dict) and set(stored) == {"intent"}


# The member of an accepted job's stored envelope that pins its prompt template versions (ADR
# 0009): {name: version}, resolved at acceptance; never part of the fingerprint.
PINS = "prompts"


def stored_intent(stored: Any) -> tuple[Any, dict[str, int]] | None:
    """An accepted job's intent and the prompt template versions it was pinned to when it was
    accepted (``{"intent": …, "prompts": {name: version}}``; a job accepted before pins were
    stored has none), or None for a stored request that is not an intent."""
    if not isinstance(stored, dict) or "intent" not in stored or not set(stored) <= {"intent", PINS}:
        return None
    pins = stored.get(PINS) or {}
    if not isinstance(pins, dict):
        return stored["intent"], {}
    return stored["intent"], {
        str(name): int(version)
        for name, version in pins.items()
        if isinstance(version, int) and not isinstance(version, bool) and version >= 1
    }


# --- A render job's labels ------------------------------------------------------------------------

# The intent fields that say which render a job is: every attempt's log line, the provider-call
# histogram and a failed attempt's evidence carry them (ADR 0016). A label is a short word; a
# value of another shape (free text in a schema that declares these names as strings) is left
# out, never shown — these land in logs, metrics and rows kept past the job's retention.
RENDER_LABEL_FIELDS = ("preset_version", "aspect_class")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


@dataclass(frozen=True)
class RenderLabels:
    preset_version: str = ""
    aspect_class: str = ""


def render_labels(stored: Any) -> RenderLabels:
    """The preset version and aspect class of a stored request (``{"intent": …}``), as label
    text; empty for a request that is not an intent or an intent without them."""
    found = stored_intent(stored)
    intent = found[0] if found is not None else None
    if not isinstance(intent, dict):
        return RenderLabels()
    values = {}
    for name in RENDER_LABEL_FIELDS:
        value = intent.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            continue
        text = str(value)
        if _LABEL.fullmatch(text):
            values[name] = text
    return RenderLabels(**values)
