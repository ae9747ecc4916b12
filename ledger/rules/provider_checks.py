"""What a provider's configuration may say, checked on every save path (the console's forms
through ``Provider.clean``, ``services.provider_upsert``) and again at send time: where it
sends (ledger.rules.outbound) and which environment variable it may read its credential from
(ledger.providers.credentials). Plain values in, messages out: no models, no crypto, so the model
module can use it."""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
from collections.abc import Iterable
from typing import Any

from django.conf import settings

from ledger.platform.errors import DestinationNotAllowed
from ledger.rules.outbound import outbound_check

DEFAULT_SECRET_PREFIX = "ONCEGUARD_SECRET_"
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_NAME_PART = re.compile(r"[A-Z0-9]+")

# A tenant's secret namespace (ADR 0001): stored on the tenant, assigned once at creation,
# letters and digits only — no "_", so the "_" after it ends it and no slug's "-" or "_" can
# spell another tenant's prefix. The database holds the same rule (a CHECK, UNIQUE, and no
# namespace a prefix of another's: triggers, ledger.0032).
NAMESPACE_MAX_LENGTH = 32
NAMESPACE_PATTERN = r"\A[A-Z0-9]{1,32}\Z"
_NAMESPACE = re.compile(NAMESPACE_PATTERN)


def secret_env_prefix() -> str:
    return str(settings.ONCEGUARD.get("PROVIDER_SECRET_PREFIX") or DEFAULT_SECRET_PREFIX)


def namespace_valid(namespace: str) -> bool:
    return bool(_NAMESPACE.fullmatch(namespace))


def namespaces_overlap(a: str, b: str) -> bool:
    """Whether one namespace is a prefix of the other (equal ones included)."""
    return a.startswith(b) or b.startswith(a)


def namespace_from_slug(slug: str) -> str:
    """The readable namespace a slug suggests: its letters and digits in upper case
    (``acme-x`` → ``ACMEX``), cut to the longest namespace; may be empty."""
    return re.sub(r"[^A-Z0-9]", "", slug.upper())[:NAMESPACE_MAX_LENGTH]


def secret_namespace_choose(slug: str, taken: Iterable[str]) -> str:
    """A namespace for a new tenant: free of ``taken`` (neither equal to nor a prefix of any,
    nor any a prefix of it), the same answer for the same slug and ``taken``. The slug's own
    (``ACME``) when free, else it with a number (``ACME2`` … ``ACME99``, free when only a
    longer one such as ``ACMEX`` was in the way), else ten letters and digits of a hash of the
    slug and an attempt number."""
    taken = [t for t in taken if t]
    base = namespace_from_slug(slug) or "T"

    def free(candidate: str) -> bool:
        return not any(namespaces_overlap(candidate, other) for other in taken)

    for number in range(1, 100):
        suffix = "" if number == 1 else str(number)
        candidate = base[: NAMESPACE_MAX_LENGTH - len(suffix)] + suffix
        if free(candidate):
            return candidate
    for attempt in itertools.count():
        digest = hashlib.sha256(f"{slug}:{attempt}".encode()).digest()
        # base32: A-Z and 2-7, inside the namespace's alphabet.
        candidate = base64.b32encode(digest).decode()[:10]
        if free(candidate):
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def tenant_env_prefix(namespace: str) -> str:
    """The start of every name a tenant's providers may reference: ``<prefix><NAMESPACE>_``."""
    return f"{secret_env_prefix()}{namespace}_"


def secret_env_names(namespace: str) -> str:
    """The names a tenant may use, as told to its users: ``ONCEGUARD_SECRET_ACME_<NAME>``
    (``<NAME>``: capital letters and digits, no ``_``)."""
    return f"{tenant_env_prefix(namespace)}<NAME>"


NAME_RULE = "NAME: A-Z and 0-9, no _"


def secret_env_refusal(*, namespace: str, name: str) -> str | None:
    """Why ``name`` may not be read as a credential of the providers of the tenant whose
    secret namespace is ``namespace`` (None: it may). A tenant without a valid namespace may
    read none."""
    if not name:
        return None
    wanted = tenant_env_prefix(namespace)
    # The name after "<NAMESPACE>_" has no "_" either: a variable's name then splits one way
    # only, so it belongs to one namespace. ACME may not read ONCEGUARD_SECRET_ACME_X_KEY,
    # the name the slug "acme-x" gave its tenant's variables before namespaces were stored.
    if (
        not namespace_valid(namespace)
        or not _ENV_NAME.fullmatch(name)
        or not name.startswith(wanted)
        or not _NAME_PART.fullmatch(name[len(wanted) :])
    ):
        allowed = (
            f"{secret_env_names(namespace)} ({NAME_RULE})" if namespace_valid(namespace) else "none (no namespace)"
        )
        return (
            f"credential variable {name[:60]!r} is not one of this tenant's declared variables, {allowed};"
            " or store the credential on the provider"
        )
    return None


# A path's placeholders: ``{name}``, substituted by path_fill. Tenants write these paths, so
# they are filled by a plain replacement, never ``str.format`` — which would evaluate
# attribute access (``{key.__class__}``), indexing and format specs (``{key:>2000000000}``
# allocates gigabytes) written into them.
_PATH_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
LOOKUP_PLACEHOLDERS = ("key", "reconciliation_handle")


def path_placeholders_problem(path: str, names: tuple[str, ...]) -> bool:
    """Whether ``path`` has a brace that is not exactly ``{name}`` of ``names``."""
    rest = _PATH_PLACEHOLDER.sub(lambda m: "" if m.group(1) in names else "{", path)
    return "{" in rest or "}" in rest


def path_fill(path: str, values: dict[str, str]) -> str:
    """``path`` with every ``{name}`` replaced by ``values[name]`` in one pass (a value is
    never read again as a placeholder); raises ``KeyError`` for a name ``values`` lacks and
    ``ValueError`` for any other brace — as a path saved before these checks may hold."""
    if path_placeholders_problem(path, tuple(values)):
        raise ValueError("the path has a brace that is not a placeholder")
    return _PATH_PLACEHOLDER.sub(lambda m: values[m.group(1)], path)


def lookup_path_problem(path: str) -> str | None:
    """A lookup path may use ``{key}`` and ``{reconciliation_handle}`` and nothing else."""
    if path_placeholders_problem(path, LOOKUP_PLACEHOLDERS):
        return "the lookup path may use only {key} and {reconciliation_handle}"
    return None


def provider_config_errors(
    *, namespace: str, base_url: str, lookup_path: str, auth_secret_env: str
) -> tuple[dict[str, str], str]:
    """(field → message, the base URL in canonical form)."""
    errors: dict[str, str] = {}
    if base_url:
        try:
            base_url = outbound_check(base_url, purpose="provider base URL").url
        except DestinationNotAllowed as exc:
            errors["base_url"] = exc.detail
    if lookup_path:
        problem = lookup_path_problem(lookup_path)
        if problem:
            errors["lookup_path"] = problem
        elif base_url and "base_url" not in errors:
            example = path_fill(lookup_path, {"key": "k", "reconciliation_handle": "h"})
            try:
                outbound_check(base_url.rstrip("/") + "/" + example.lstrip("/"), purpose="provider lookup URL")
            except DestinationNotAllowed as exc:
                errors["lookup_path"] = exc.detail
    problem = secret_env_refusal(namespace=namespace, name=auth_secret_env)
    if problem:
        errors["auth_secret_env"] = problem
    return errors, base_url


# What an asynchronous provider's status path may substitute: the job id the submit answered.
POLL_PLACEHOLDER = "provider_ref"
_POINTER_FIELDS = (
    "poll_status_pointer",
    "output_url_pointer",
    "output_sha256_pointer",
    "output_size_pointer",
    "output_width_pointer",
    "output_height_pointer",
)
_VALUE_FIELDS = ("poll_succeeded_values", "poll_failed_values", "poll_pending_values")


def poll_path_problem(path: str) -> str | None:
    """A status path may use ``{provider_ref}`` and nothing else, and must use it."""
    if path_placeholders_problem(path, (POLL_PLACEHOLDER,)):
        return "the status path may use only {provider_ref}"
    if not path.isprintable() or any(c.isspace() for c in path):
        return "the status path may not hold blanks or control characters"
    example = path_fill(path, {POLL_PLACEHOLDER: "job"})
    if "{" + POLL_PLACEHOLDER + "}" not in path or not example.startswith("/"):
        return "the status path is a path under the base URL naming the job: /…{provider_ref}…"
    return None


def async_config_errors(values: dict[str, Any]) -> dict[str, str]:
    """(field → message) for an asynchronous provider's adapter fields (DESIGN §5,
    asynchronous providers). ``values``: the fields by name; an empty ``poll_path`` means a
    synchronous provider, whose other async fields are not looked at."""
    errors: dict[str, str] = {}
    path = str(values.get("poll_path") or "")
    if not path:
        return errors
    problem = poll_path_problem(path)
    if problem:
        errors["poll_path"] = problem
    if not values.get("ref_pointer"):
        errors["ref_pointer"] = "an asynchronous provider needs a ref pointer: where the submit answer names the job"
    for name in _POINTER_FIELDS:
        pointer = str(values.get(name) or "")
        if pointer and not pointer.startswith("/"):
            errors[name] = "a JSON pointer starts with /"
    if not values.get("poll_status_pointer"):
        errors["poll_status_pointer"] = "an asynchronous provider needs the status answer's status pointer"
    for name in _VALUE_FIELDS:
        listed = values.get(name) or []
        if not isinstance(listed, list) or not all(isinstance(v, str) and 0 < len(v) <= 100 for v in listed):
            errors[name] = "a list of status values (strings)"
    if not values.get("poll_succeeded_values") or not values.get("poll_failed_values"):
        errors.setdefault("poll_succeeded_values", "name the terminal status values: succeeded and failed")
    seen: dict[str, str] = {}
    for name in _VALUE_FIELDS:
        for value in values.get(name) or []:
            if isinstance(value, str) and seen.setdefault(value, name) != name:
                errors[name] = f"the status value {value!r} is listed twice"
    types = values.get("output_media_types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) and "/" in t for t in types):
        errors["output_media_types"] = "a list of media types such as image/png"
    first, cap = values.get("poll_initial_seconds"), values.get("poll_max_seconds")
    if not isinstance(first, (int, float)) or not 0.01 <= float(first) <= 3600:
        errors["poll_initial_seconds"] = "between 0.01 and 3600 seconds"
    elif not isinstance(cap, (int, float)) or not float(first) <= float(cap) <= 86400:
        errors["poll_max_seconds"] = "between the first poll's delay and 86400 seconds"
    return errors
