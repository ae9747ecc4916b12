"""Evaluation manifests (ADR 0022), the plain-value part: a manifest's canonical form and
digest, a preset's manifest schema checked, and the comparison of an extraction's fields with
a manifest. No models, no database (ledger.execution.manifests stores and scores)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from typing import Any

import jsonschema

from ledger.platform.errors import DomainError, ValidationFailed

MAX_MANIFEST_BYTES = 64 * 1024
# Totals match within a cent unless the preset's schema says otherwise (``x-tolerance``).
DEFAULT_TOLERANCE = 0.01
MATCH_KINDS = ("exact", "normalized", "numeric")
# A string field compared exactly when its name says it is an identifier or a code.
_EXACT_NAME = re.compile(r"(^|_)(id|number|no|code|currency|iban|sku|ref)$|id$")
_PUNCTUATION = re.compile(r"[\s.,;:'\"`´’\-_/&()]+")


class ManifestInvalid(DomainError):
    """Not a JSON object of at most MAX_MANIFEST_BYTES, or not what the job's preset declares."""

    status, code, title = 422, "manifest_invalid", "Manifest not valid"


class ManifestSchemaInvalid(ValidationFailed):
    """A preset's ``manifest_schema`` is not a JSON Schema."""

    code, title = "manifest_schema_invalid", "Manifest schema not valid"


def canonical_bytes(value: Any) -> bytes:
    """The manifest's canonical JSON (sorted keys, no spaces, UTF-8): what its digest covers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def manifest_schema_check(schema: Any) -> None:
    """Refuse a preset's manifest schema that is not a JSON Schema (draft 2020-12) object."""
    if schema is None:
        return
    if not isinstance(schema, dict) or len(canonical_bytes(schema)) > MAX_MANIFEST_BYTES:
        raise ManifestSchemaInvalid(
            f"manifest_schema must be a JSON Schema object of at most {MAX_MANIFEST_BYTES} bytes."
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ManifestSchemaInvalid(f"manifest_schema is not a JSON Schema: {exc.message[:300]}") from None


def manifest_digest(manifest: Any, schemas: list[tuple[str, Any]]) -> str:
    """The sha256 of ``manifest``'s canonical JSON once it is checked: a non-empty object, at
    most MAX_MANIFEST_BYTES, matching every (label, schema) given; else ManifestInvalid."""
    if not isinstance(manifest, dict) or not manifest:
        raise ManifestInvalid("manifest must be a non-empty JSON object.")
    try:
        raw = canonical_bytes(manifest)
    except ValueError:
        raise ManifestInvalid("manifest must be JSON (no NaN or infinity).") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestInvalid(f"manifest is {len(raw)} bytes; the limit is {MAX_MANIFEST_BYTES}.")
    for label, schema in schemas:
        problems = sorted(
            jsonschema.Draft202012Validator(schema).iter_errors(manifest),
            key=lambda e: [str(p) for p in e.absolute_path],
        )
        if problems:
            # Where and which rule, never the value (a manifest may hold a person's name).
            listed = [
                {"path": "/" + "/".join(str(p) for p in e.absolute_path), "rule": str(e.validator)} for e in problems
            ][:20]
            raise ManifestInvalid(
                f"manifest does not match the manifest schema of preset {label}.",
                extra={"preset": label, "problems": listed},
            )
    return hashlib.sha256(raw).hexdigest()


# --- Comparing an extraction with a manifest ------------------------------------------------------


def _schema_child(schema: Any, key: str | int) -> Any:
    if not isinstance(schema, dict):
        return None
    if isinstance(key, int):
        return schema.get("items") if isinstance(schema.get("items"), dict) else None
    properties = schema.get("properties")
    return properties.get(key) if isinstance(properties, dict) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _as_number(value: Any) -> float | None:
    """A number, or a numeric string as extractors write them ("1,234.50", "€ 12.00")."""
    if _is_number(value):
        return float(value)
    if isinstance(value, str):
        text = re.sub(r"[^\d.\-]", "", value.replace(",", ""))
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def normalized(text: str) -> str:
    """A name as compared: compatibility forms folded, case folded, punctuation and spacing
    reduced to single spaces ("ACME  Corp." and "Acme corp" are one name)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return _PUNCTUATION.sub(" ", folded).strip()


def match_kind(name: str, expected: Any, schema: Any) -> str:
    """How a field is compared: the schema's ``x-match`` where it says, else numbers within a
    tolerance, identifiers and codes exactly, other text normalized."""
    declared = schema.get("x-match") if isinstance(schema, dict) else None
    if declared in MATCH_KINDS:
        return str(declared)
    if _is_number(expected):
        return "numeric"
    if isinstance(expected, str) and not _EXACT_NAME.search(name.lower()):
        return "normalized"
    return "exact"


def _leaf_matches(kind: str, name: str, expected: Any, actual: Any, schema: Any) -> bool:
    if kind == "numeric":
        want, got = _as_number(expected), _as_number(actual)
        if want is None or got is None:
            return False
        tolerance = schema.get("x-tolerance") if isinstance(schema, dict) else None
        tolerance = float(tolerance) if _is_number(tolerance) else DEFAULT_TOLERANCE
        return abs(want - got) <= tolerance + 1e-9
    if kind == "normalized":
        return isinstance(actual, str) and isinstance(expected, str) and normalized(expected) == normalized(actual)
    if isinstance(expected, str) and isinstance(actual, str):
        if name.lower().endswith("currency"):
            # ISO 4217 codes: "eur" and "EUR" are one currency.
            return expected.strip().upper() == actual.strip().upper()
        return expected.strip() == actual.strip()
    return expected == actual


def _item_key(schema: Any) -> str:
    declared = schema.get("x-key") if isinstance(schema, dict) else None
    return declared if isinstance(declared, str) and declared else "id"


def _compare(path: str, name: str, expected: Any, actual: Any, schema: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(expected, dict):
        for key in sorted(expected):
            child = actual.get(key) if isinstance(actual, dict) else None
            present = isinstance(actual, dict) and key in actual
            sub = f"{path}.{key}" if path else key
            if not present:
                _missing(sub, expected[key], out)
            else:
                _compare(sub, key, expected[key], child, _schema_child(schema, key), out)
        return
    if isinstance(expected, list):
        items = actual if isinstance(actual, list) else []
        _compare_items(path, expected, items, _schema_child(schema, 0), out)
        return
    kind = match_kind(name, expected, schema)
    result = "match" if _leaf_matches(kind, name, expected, actual, schema) else "mismatch"
    out.append({"field": path, "match": kind, "result": result})


def _missing(path: str, expected: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(expected, dict):
        for key in sorted(expected):
            _missing(f"{path}.{key}", expected[key], out)
    elif isinstance(expected, list):
        for i, item in enumerate(expected):
            _missing(f"{path}[{i}]", item, out)
    else:
        out.append({"field": path, "match": match_kind(path.rsplit(".", 1)[-1], expected, None), "result": "missing"})


def _compare_items(path: str, expected: list[Any], items: list[Any], schema: Any, out: list[dict[str, Any]]) -> None:
    """Line items: by their key (``id``, or the schema's ``x-key``) when every expected item has
    one, else by position. An extracted item no expected one matched counts against the score."""
    key = _item_key(schema)
    keyed = bool(expected) and all(isinstance(e, dict) and key in e for e in expected)
    used: set[int] = set()
    for i, want in enumerate(expected):
        if keyed:
            found = next(
                (
                    j
                    for j, got in enumerate(items)
                    if j not in used and isinstance(got, dict) and str(got.get(key)) == str(want[key])
                ),
                None,
            )
        else:
            found = i if i < len(items) else None
        where = f"{path}[{i}]"
        if found is None:
            _missing(where, want, out)
            continue
        used.add(found)
        _compare(where, path.rsplit(".", 1)[-1], want, items[found], schema, out)
    for j in range(len(items)):
        if j not in used:
            out.append({"field": f"{path}[+{j}]", "match": "item", "result": "unexpected"})


def manifest_compare(
    expected: dict[str, Any], extracted: dict[str, Any], *, schema: Any = None
) -> tuple[float, list[dict[str, Any]]]:
    """The score (matched fields over expected fields plus unexpected line items, 0..1) and one
    detail per field: its path, how it was compared, and match / mismatch / missing /
    unexpected. Never a value: the details are kept without sealing."""
    details: list[dict[str, Any]] = []
    _compare("", "", expected, extracted, schema, details)
    if not details:
        return 0.0, []
    matched = sum(1 for d in details if d["result"] == "match")
    return round(matched / len(details), 6), details
