"""Every setting the service reads from the environment, declared once: name, type, default,
meaning — and the one function that reads them (:func:`read`).

``config.settings`` builds Django's settings from this table, and calls :func:`validate` first,
so a bad value stops the start with a message naming the variable and what it accepts,
instead of a ``ValueError`` deep in a request. The few values read per call rather than once
at start (the keys of ``ledger.platform.crypto``, ``ledger.rules.key_derivation`` and ``review.accesslog``,
which an operator may rotate and the tests set per test) are read through :func:`read` too.
``docs/reference/settings.md`` is generated from this table (``manage.py settings_reference``).

Not here: a provider's credential named ``<ONCEGUARD_PROVIDER_SECRET_PREFIX><TENANT>_…``
(``ledger.providers.credentials``: its names are the operator's, not the service's), and the harness
variables of the tests, ``bench/``, ``soak`` and ``scripts/``.

It lives in the ledger, the floor every app may import (``.importlinter``), and imports only
the standard library and Django's exception: ``config.settings`` reads it before Django is
configured.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# Kinds of value, and what a reader is told each accepts.
STR, INT, FLOAT, BOOL, LIST, CIDRS, REGEX_LINES, JSON_OBJECT, CHOICE, PATH = (
    "str",
    "int",
    "float",
    "bool",
    "list",
    "cidrs",
    "regex lines",
    "JSON object",
    "choice",
    "path",
)
_ACCEPTS = {
    STR: "text",
    INT: "a whole number (e.g. 60)",
    FLOAT: "a number (e.g. 0.5)",
    BOOL: "1/0, true/false, yes/no or on/off",
    LIST: "comma-separated values",
    CIDRS: "comma-separated IP addresses or networks (e.g. 10.0.0.0/8,192.168.1.10)",
    REGEX_LINES: "regular expressions, one per line",
    JSON_OBJECT: 'a JSON object (e.g. {"bucket_name": "x"})',
    PATH: "a file or folder path",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingError(ImproperlyConfigured):
    """A variable's value is not one its setting accepts (the message says which and why)."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    # None: derived at start (``default_text`` says how), or unset means "off".
    default: Any
    meaning: str
    group: str = ""
    # Where the service reads it (a Django setting, a module).
    read_as: str = ""
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    # Letters and digits only, e.g. a region code: a regular expression the stripped value must match.
    pattern: str = ""
    # A key or a password: its value is never shown in a message or in the reference.
    secret: bool = False
    # An earlier name still read when the variable itself is unset.
    former_names: tuple[str, ...] = ()
    # Set to the empty string: the empty value (an empty list, no text), not the default.
    blank_is_value: bool = False
    default_text: str = ""

    def accepts(self) -> str:
        if self.kind == CHOICE:
            text = "one of " + ", ".join(self.choices)
        else:
            text = _ACCEPTS[self.kind]
        if self.minimum is not None:
            text += f", at least {self.minimum:g}"
        if self.pattern:
            text += f", matching {self.pattern}"
        return text

    def default_shown(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None or self.default == "":
            return "(unset)"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, list | tuple):
            return ",".join(str(v) for v in self.default) or "(empty)"
        if isinstance(self.default, dict):
            return json.dumps(self.default) if self.default else "{}"
        return str(self.default)

    def parse(self, raw: str) -> Any:
        """``raw`` (the variable's text, not empty) as this setting's value; SettingError if it
        is not one it accepts."""
        text = raw.strip()
        try:
            value = _PARSERS[self.kind](self, raw, text)
        except (ValueError, TypeError, re.error) as exc:
            raise self._error(raw, str(exc)) from None
        if self.minimum is not None and value < self.minimum:
            raise self._error(raw, f"below {self.minimum:g}")
        if self.pattern and text and not re.fullmatch(self.pattern, text):
            raise self._error(raw, "does not match")
        return value

    def _error(self, raw: str, why: str) -> SettingError:
        shown = "(hidden)" if self.secret else repr(raw)
        return SettingError(f"{self.name}={shown} is not valid ({why}): it accepts {self.accepts()}.")


def _int(s: Setting, raw: str, text: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9][0-9_]*", text):
        raise ValueError("not a whole number")
    return int(text)


def _float(s: Setting, raw: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


def _bool(s: Setting, raw: str, text: str) -> bool:
    word = text.lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("not a yes or a no")


def _list(s: Setting, raw: str, text: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _cidrs(s: Setting, raw: str, text: str) -> list[str]:
    parts = _list(s, raw, text)
    for part in parts:
        ipaddress.ip_network(part, strict=False)
    return parts


def _regex_lines(s: Setting, raw: str, text: str) -> list[str]:
    lines = [line.strip() for line in raw.splitlines() if line.strip()]
    for line in lines:
        re.compile(line)
    return lines


def _json_object(s: Setting, raw: str, text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _choice(s: Setting, raw: str, text: str) -> str:
    if text in s.choices:
        return text
    folded = {c.lower(): c for c in s.choices}
    if text.lower() in folded:
        return folded[text.lower()]
    raise ValueError("not one of the choices")


def _str(s: Setting, raw: str, text: str) -> str:
    return raw


_PARSERS = {
    STR: _str,
    PATH: _str,
    INT: _int,
    FLOAT: _float,
    BOOL: _bool,
    LIST: _list,
    CIDRS: _cidrs,
    REGEX_LINES: _regex_lines,
    JSON_OBJECT: _json_object,
    CHOICE: _choice,
}


def _s(name: str, kind: str, default: Any, meaning: str, **kw: Any) -> Setting:
    return Setting(name, kind, default, " ".join(meaning.split()), **kw)


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _group(group: str, read_as: str, *settings: Setting) -> list[Setting]:
    """The settings of one part of the service; ``read_as`` with ``{}`` is filled with the
    setting's key (its name unless the setting says otherwise)."""
    out = []
    for s in settings:
        target = s.read_as or (read_as.format(s.name) if read_as else "")
        out.append(Setting(**{**s.__dict__, "group": group, "read_as": target}))
    return out


SETTINGS: tuple[Setting, ...] = tuple(
    [
        *_group(
            "Core",
            "settings.{}",
            _s(
                "ONCEGUARD_VAR_DIR",
                PATH,
                None,
                "Folder of the embedded mode's files: the SQLite database, generated keys, objects.",
                default_text="var/ in the checkout",
                read_as="settings.VAR_DIR",
            ),
            _s(
                "SECRET_KEY",
                STR,
                None,
                "Django's secret key. Unset: one generated once into var/secret_key (mode 600).",
                secret=True,
                default_text="generated into var/secret_key",
            ),
            _s("DEBUG", BOOL, False, "Django's debug mode. Never on in production."),
            _s(
                "ALLOWED_HOSTS",
                LIST,
                ["localhost", "127.0.0.1", "[::1]"],
                "Host names the service answers to.",
                blank_is_value=True,
            ),
            _s("CSRF_TRUSTED_ORIGINS", LIST, [], "Origins trusted for the console's forms behind a TLS proxy."),
            _s(
                "DEFAULT_PHONE_REGION",
                STR,
                "",
                """Region (ISO 3166 code, e.g. AU) of phone numbers typed without a country code,
                for the data-subject index and search; empty: such numbers keep their digits.""",
                pattern=r"[A-Za-z]{2}",
            ),
            _s(
                "ONCEGUARD_DEFAULT_COUNTRY_CODE",
                STR,
                "",
                """Calling code (e.g. 61) put before a national phone number (leading 0) when
                ONCEGUARD_PRIVACY names none.""",
                pattern=r"[0-9]{1,3}",
                read_as="ledger.platform.crypto (per call)",
            ),
        ),
        *_group(
            "Database",
            "",
            _s(
                "DATABASE_URL",
                STR,
                "",
                "PostgreSQL URL (postgres://user:password@host:5432/name). Unset: the embedded SQLite file.",
                secret=True,
                read_as="settings.DATABASES",
            ),
            _s(
                "SQLITE_PATH",
                PATH,
                None,
                "The embedded database's file.",
                default_text="var/onceguard.sqlite3",
                read_as="settings.SQLITE_PATH",
            ),
            _s(
                "DB_HEALTH_CHECKS",
                BOOL,
                False,
                """Django's per-request connection health check (a round trip); off because
                config.middleware.DeadConnectionMiddleware drops dead connections without one.""",
                read_as="settings.DATABASES",
            ),
            _s(
                "DB_CONNECT_TIMEOUT_SECONDS",
                INT,
                5,
                "A connect to PostgreSQL gives up after this long (libpq's minimum is 2).",
                minimum=0,
                read_as="settings.DATABASES",
            ),
            _s(
                "PG_PREPARE_THRESHOLD",
                INT,
                5,
                """psycopg prepares a statement after this many uses (server-side binding); 0
                disables it (PgBouncer in transaction mode older than 1.21).""",
                minimum=0,
                read_as="settings.DATABASES",
            ),
            _s(
                "PG_TEST_DB_NAME",
                STR,
                "",
                "Tests only: the PostgreSQL test database's name, so parallel runs on one server do not collide.",
                read_as="settings.DATABASES",
            ),
            _s(
                "SQLITE_TEST_PATH",
                PATH,
                None,
                "Tests only: the SQLite test database's file.",
                default_text="var/test.sqlite3",
                read_as="settings.DATABASES",
            ),
        ),
        *_group(
            "Object storage",
            "settings.STORAGES",
            _s(
                "OBJECT_STORAGE_BACKEND",
                STR,
                "",
                """Django storage backend of uploads and published outputs (e.g.
                storages.backends.s3.S3Storage).""",
                default_text="django.core.files.storage.FileSystemStorage",
            ),
            _s("OBJECT_STORAGE_OPTIONS", JSON_OBJECT, {}, "Options of that backend."),
            _s(
                "OBJECT_STORAGE_DIR",
                PATH,
                None,
                "The file system backend's folder.",
                default_text="var/objects",
            ),
            _s(
                "QUARANTINE_STORAGE_BACKEND",
                STR,
                "",
                "Storage backend of fetched outputs before their checks pass (never readable).",
                default_text="django.core.files.storage.FileSystemStorage",
            ),
            _s("QUARANTINE_STORAGE_OPTIONS", JSON_OBJECT, {}, "Options of that backend."),
            _s(
                "QUARANTINE_STORAGE_DIR",
                PATH,
                None,
                "The file system backend's folder.",
                default_text="var/quarantine",
            ),
        ),
        *_group(
            "Security",
            "settings.{}",
            _s("SESSION_COOKIE_AGE", INT, 8 * 3600, "Console sessions end at most this long after sign-in.", minimum=0),
            _s("SESSION_EXPIRE_AT_BROWSER_CLOSE", BOOL, True, "Console sessions end when the browser closes."),
            _s(
                "SECURE_COOKIES",
                BOOL,
                None,
                """Secure cookies and HSTS. Unset: on when DEBUG is off and ALLOWED_HOSTS names a
                host that is not loopback (the service sits behind TLS).""",
                default_text="automatic",
            ),
            _s("SECURE_HSTS_SECONDS", INT, 31536000, "HSTS max-age, with secure cookies.", minimum=0),
            _s("SECURE_SSL_REDIRECT", BOOL, True, "Plain-http requests are redirected to https, with secure cookies."),
            _s("SECURE_HSTS_INCLUDE_SUBDOMAINS", BOOL, True, "HSTS covers subdomains, with secure cookies."),
            _s("SECURE_HSTS_PRELOAD", BOOL, True, "HSTS asks for preload, with secure cookies."),
            _s(
                "TRUSTED_PROXIES",
                CIDRS,
                [],
                """The deployment's own reverse proxies: only a request from one of them has its
                X-Forwarded-For read for the client's address (login throttling, access log).""",
            ),
            _s(
                "MAX_REQUEST_BYTES",
                INT,
                1024 * 1024,
                "Request bodies larger than this are refused with 413 before anything is parsed.",
                minimum=1,
            ),
            _s(
                "LOGIN_WINDOW_SECONDS",
                INT,
                900,
                "Console sign-in failures are counted over this window.",
                minimum=1,
                read_as="review.security (ONCEGUARD_SECURITY overrides)",
            ),
            _s(
                "LOGIN_MAX_FAILURES",
                INT,
                5,
                "Failures of one username from one address within the window that lock that pair out.",
                minimum=1,
                read_as="review.security (ONCEGUARD_SECURITY overrides)",
            ),
            _s(
                "LOGIN_MAX_FAILURES_PER_IP",
                INT,
                30,
                "Failures from one address within the window, whatever the usernames, that lock it out.",
                minimum=1,
                read_as="review.security (ONCEGUARD_SECURITY overrides)",
            ),
            _s(
                "ONCEGUARD_ENCRYPTION_KEYS",
                STR,
                "",
                """Keys sealing payloads at rest: <id>:<fernet key>,… (first = current). Unset: a
                key generated once into var/ (docs/secrets.md).""",
                secret=True,
                read_as="ledger.platform.crypto (per call)",
            ),
            _s(
                "ONCEGUARD_KEY_DERIVATION_KEY",
                STR,
                "",
                """<id>:<secret> (secret at least 32 characters) of POST /api/v1/keys/derive. Unset: one
                generated once into var/key-derivation.key. Never rotate it: every derived key
                would change (docs/secrets.md).""",
                secret=True,
                read_as="ledger.rules.key_derivation (per call)",
            ),
            _s(
                "ONCEGUARD_ACCESSLOG_KEYS",
                STR,
                "",
                """HMAC keys of the access log's chain: <id>:<secret>,… (secrets at least 32
                characters; first = current, the others still verify). Keep them outside the
                database and its backups.""",
                secret=True,
                read_as="review.accesslog (per call)",
            ),
            _s(
                "ONCEGUARD_ACCESSLOG_KEY_FILE",
                PATH,
                "",
                "File holding the access log's keys when ONCEGUARD_ACCESSLOG_KEYS is unset.",
                default_text="var/accesslog.key",
                read_as="review.accesslog (per call)",
            ),
        ),
        *_group(
            "Ledger",
            "settings.ONCEGUARD['{}']",
            _s(
                "OPERATION_SEARCH_PATHS",
                LIST,
                [
                    "event_type",
                    "action",
                    "method",
                    "path",
                    "source",
                    "body.source",
                    "workflow.id",
                    "call.agent_id",
                    "order_id",
                    "body.order_id",
                ],
                """Payload paths copied in plain text into Operation.search_fields for filtering
                (?match=path:value). Only non-personal paths belong here.""",
                blank_is_value=True,
            ),
            _s(
                "API_KEY_CACHE_SECONDS",
                INT,
                5,
                "Per-process cache of API keys (0 disables): a revoked key stops within this long.",
                minimum=0,
            ),
            _s(
                "PROVIDER_CACHE_SECONDS",
                INT,
                5,
                "Per-process cache of providers (0 disables): a change takes effect within this long.",
                minimum=0,
            ),
            _s(
                "ADAPTER_REVISION_CACHE_SECONDS",
                INT,
                3600,
                "Adapter revisions never change: a process keeps the ones it used this long.",
                minimum=0,
            ),
            _s(
                "PROMPT_TEMPLATE_CACHE_SECONDS",
                INT,
                3600,
                "Prompt template versions are immutable too; the newest is never cached.",
                minimum=0,
            ),
            _s(
                "WORKFLOW_NAME_CACHE_SECONDS",
                INT,
                600,
                "A workflow name a process has noted is not written again for this long.",
                minimum=0,
            ),
            _s("LEASE_MIN_SECONDS", INT, 5, "A caller's lease wish is clamped to at least this.", minimum=1),
            _s("LEASE_MAX_SECONDS", INT, 15 * 60, "… and at most this.", minimum=1),
            _s("LEASE_DEFAULT_SECONDS", INT, 60, "The lease when the caller asks for none.", minimum=1),
            _s(
                "RECONCILE_LEASE_SECONDS",
                INT,
                60,
                "How long a sweeper pass holds a row it reconciles.",
                minimum=1,
            ),
            _s(
                "LOOKUP_FAILURE_LIMIT",
                INT,
                5,
                "Failed provider lookups of a row before a human is asked.",
                minimum=1,
            ),
            _s(
                "STUCK_ALERT_SECONDS",
                INT,
                3600,
                "An open row this old counts as stuck (one alert per row).",
                minimum=0,
            ),
            _s("SWEEP_INTERVAL_SECONDS", INT, 30, "How often the sweeper runs.", minimum=1),
            _s(
                "POLL_OVERDUE_SECONDS",
                INT,
                60,
                """A row waiting on an asynchronous provider past its lifetime whose poll is this
                overdue goes to review.""",
                minimum=0,
            ),
            _s(
                "WORKER_LEASE_MARGIN_SECONDS",
                FLOAT,
                5.0,
                """Execute mode: a worker's lease is 2 × the provider's timeout +
                RECORD_RETRY_SECONDS + this margin (attempt timeout < lease < Q_TIMEOUT < Q_RETRY);
                also how long after its take a worker may still start sending.""",
                minimum=0,
            ),
            _s(
                "RECORD_RETRY_SECONDS",
                FLOAT,
                30.0,
                """How long a worker holding a provider's answer retries recording it while the
                database is unreachable, before leaving the row to the sweeper.""",
                minimum=0,
            ),
            _s(
                "RETRY_AFTER_MAX_SECONDS",
                INT,
                3600,
                """A provider's Retry-After is honoured up to this, or up to the provider's own
                max_delay_seconds when that is longer.""",
                minimum=0,
            ),
            _s(
                "PROVIDER_RATE_DECREASE",
                FLOAT,
                0.5,
                """A 429 (or a 503 with Retry-After) multiplies a rate-capped provider's effective
                rate by this (clamped to 0.01–1).""",
                minimum=0,
            ),
            _s(
                "PROVIDER_RATE_FLOOR_FRACTION",
                FLOAT,
                0.0625,
                "… never below this fraction of its declared rate (clamped to 0.001–1).",
                minimum=0,
            ),
            _s(
                "PROVIDER_RATE_RECOVERY_SECONDS",
                FLOAT,
                30.0,
                "After this long without one the rate climbs back one step.",
                minimum=0,
            ),
            _s(
                "PROVIDER_RATE_STEP_FRACTION",
                FLOAT,
                0.1,
                "… by this fraction of the declared rate (clamped to 0.001–1).",
                minimum=0,
            ),
            _s(
                "DATABASE_RETRY_AFTER_SECONDS",
                INT,
                5,
                "Retry-After of the API's 503 database_unavailable answer.",
                minimum=0,
            ),
            _s(
                "EXECUTE_MAX_REQUEST_BYTES",
                INT,
                256 * 1024,
                "Largest stored request envelope (method, path, query, headers, body as canonical JSON).",
                minimum=1,
            ),
            _s(
                "WORKER_MAX_RESPONSE_BYTES",
                INT,
                256 * 1024,
                "Largest provider response a worker reads.",
                minimum=1,
            ),
            _s(
                "OUTBOUND_ALLOW",
                STR,
                "",
                """Where the service may send besides public addresses: comma-separated host
                names, *.suffixes, addresses or CIDRs, each with an optional :port or
                :first-last (ledger.rules.outbound).""",
            ),
            _s(
                "DEMO_OUTBOUND_ALLOW",
                STR,
                "",
                "The demo receivers' loopback ports, added to OUTBOUND_ALLOW by make run (var/local.env).",
                read_as="settings.ONCEGUARD['OUTBOUND_ALLOW']",
            ),
            _s(
                "OUTBOUND_ALLOW_PUBLIC",
                BOOL,
                True,
                "Public addresses may be sent to (0: only what OUTBOUND_ALLOW lists).",
            ),
            _s(
                "ONCEGUARD_PROVIDER_SECRET_PREFIX",
                STR,
                "ONCEGUARD_SECRET_",
                """A provider credential read from the environment must be named
                <prefix><TENANT>_<anything>; nothing else is read.""",
                read_as="settings.ONCEGUARD['PROVIDER_SECRET_PREFIX']",
            ),
            _s(
                "CALLBACK_SECRET_OVERLAP_SECONDS",
                INT,
                86400,
                "After a callback secret is rotated the previous one still signs for this long.",
                minimum=0,
            ),
            _s("CALLBACK_TIMEOUT_SECONDS", INT, 5, "A callback delivery may take this long.", minimum=1),
            _s("CALLBACK_MAX_ATTEMPTS", INT, 8, "Delivery attempts of one callback.", minimum=1),
            _s(
                "ELIGIBILITY_TIMEOUT_SECONDS",
                INT,
                5,
                'How long the tenant\'s webhook may take to answer "still wanted?".',
                minimum=1,
            ),
            _s(
                "ELIGIBILITY_ASK_INTERVAL_SECONDS",
                INT,
                30,
                "How long a retry that got no answer waits before it is asked again.",
                minimum=0,
            ),
            _s(
                "CANARY_WINDOW_SECONDS",
                INT,
                900,
                "A canary revision is judged on its attempts within this window.",
                minimum=1,
            ),
            _s(
                "CANARY_MIN_SAMPLE",
                INT,
                20,
                "Counted attempts a canary needs before it can be rolled back on its own.",
                minimum=1,
            ),
            _s(
                "CANARY_MAX_EXCESS_PERCENT",
                FLOAT,
                10.0,
                "A canary whose failure rate exceeds the stable revision's by more points is rolled back.",
                minimum=0,
            ),
            _s(
                "UPLOAD_MAX_BYTES",
                INT,
                10 * 1024 * 1024,
                "The largest upload taken, counted while it streams in.",
                minimum=1,
            ),
            _s(
                "UPLOAD_MEDIA_TYPES",
                LIST,
                ["image/png", "image/jpeg", "image/webp", "image/gif"],
                "Media types uploads may have, recognised by their content.",
                blank_is_value=True,
            ),
            _s(
                "IMAGE_MAX_PIXELS",
                INT,
                16_777_216,
                "Images with more pixels are refused before they are decoded (decompression bombs).",
                minimum=1,
            ),
            _s("OUTPUT_MAX_BYTES", INT, 20 * 1024 * 1024, "The largest validated output fetched.", minimum=1),
            _s(
                "OUTPUT_FETCH_TIMEOUT_SECONDS",
                FLOAT,
                30.0,
                "How long fetching an output may take.",
                minimum=0,
            ),
            _s(
                "ERROR_SCRUB_PATTERNS",
                REGEX_LINES,
                [],
                """The deployment's identifier shapes masked in stored error text, besides e-mail
                addresses, phone numbers, tokens and keys: one regular expression per line.""",
            ),
        ),
        *_group(
            "Access log",
            "settings.ONCEGUARD_ACCESS_LOG",
            _s(
                "ACCESS_LOG_MIN_RETENTION_DAYS",
                INT,
                365,
                "The platform's floor: no tenant's policy, and no purge, removes a younger row.",
                minimum=0,
            ),
            _s(
                "ACCESS_LOG_CHECKPOINT_MINUTES",
                INT,
                15,
                "Signed checkpoints of every chain's head this often.",
                minimum=1,
            ),
            _s(
                "ACCESS_LOG_CHECKPOINT_HEARTBEAT_HOURS",
                INT,
                24,
                "… and at least this often even when nothing happened.",
                minimum=1,
            ),
            _s(
                "ACCESS_LOG_CHECKPOINT_GRACE_MINUTES",
                INT,
                60,
                "accesslog_verify reports rows left uncovered longer than the interval plus this.",
                minimum=0,
            ),
        ),
        *_group(
            "Retention",
            "settings.ONCEGUARD_RETENTION",
            _s(
                "RETENTION_APPLY_DEFAULTS",
                BOOL,
                True,
                """A tenant without a policy for a record type gets the defaults below (0: keep
                everything until a policy says otherwise).""",
            ),
            _s("RETENTION_OPERATIONS_PAYLOAD_DAYS", INT, 30, "Operations' payloads are kept this long.", minimum=0),
            _s("RETENTION_OPERATIONS_RECORD_DAYS", INT, 365, "Operations' records are kept this long.", minimum=0),
            _s("RETENTION_DLQ_PAYLOAD_DAYS", INT, 30, "DLQ entries' payloads are kept this long.", minimum=0),
            _s("RETENTION_DLQ_RECORD_DAYS", INT, 90, "DLQ entries' records are kept this long.", minimum=0),
            _s("RETENTION_ACCESS_LOG_RECORD_DAYS", INT, 2555, "Access-log rows are kept this long.", minimum=0),
            _s(
                "RETENTION_FLOOR_OPERATIONS_PAYLOAD_DAYS",
                INT,
                1,
                "No tenant's policy keeps operations' payloads shorter.",
                minimum=0,
            ),
            _s(
                "RETENTION_FLOOR_OPERATIONS_RECORD_DAYS",
                INT,
                30,
                "No tenant's policy keeps operations' records shorter.",
                minimum=0,
            ),
            _s(
                "RETENTION_FLOOR_DLQ_PAYLOAD_DAYS",
                INT,
                1,
                "No tenant's policy keeps DLQ entries' payloads shorter.",
                minimum=0,
            ),
            _s(
                "RETENTION_FLOOR_DLQ_RECORD_DAYS",
                INT,
                7,
                "No tenant's policy keeps DLQ entries' records shorter.",
                minimum=0,
            ),
            _s(
                "RETENTION_INTERVAL_MINUTES",
                INT,
                60,
                "How often the retention purge runs (at least every minute).",
                read_as="review.schedules",
            ),
        ),
        *_group(
            "Task queue (django-q2)",
            "settings.Q_CLUSTER",
            _s("Q_WORKERS", INT, 2, "django-q2 worker processes.", minimum=1),
            _s("Q_TIMEOUT", INT, 120, "A task running longer is killed (< Q_RETRY).", minimum=1),
            _s("Q_RETRY", INT, 180, "A task not acknowledged after this long is handed out again.", minimum=1),
            _s("Q_REDIS_URL", STR, "", "Redis broker URL. Unset: the database is the broker.", secret=True),
        ),
        *_group(
            "Logging",
            "settings.{}",
            _s("LOG_LEVEL", CHOICE, "INFO", "Level of the service's log lines.", choices=_LOG_LEVELS),
            _s(
                "LOG_FORMAT",
                CHOICE,
                "kv",
                "json: one JSON object per line; kv: <time> <LEVEL> <logger> <event> key=value ….",
                choices=("kv", "json"),
            ),
            _s(
                "REQUEST_LOG_SLOW_MS",
                INT,
                0,
                "Log only error answers and requests of at least this many ms (0: no request log).",
                minimum=0,
            ),
        ),
        *_group(
            "Health and metrics",
            "settings.{}",
            _s(
                "PROMETHEUS_MULTIPROC_DIR",
                PATH,
                "",
                """Folder through which several processes add up their histograms
                (prometheus-client's multi-process mode); set in every process's environment.""",
            ),
            _s(
                "METRICS_TOKEN",
                STR,
                "",
                "/metrics answers only Authorization: Bearer <token> (at least 16 characters). Unset: off.",
                secret=True,
            ),
            _s(
                "METRICS_TOKEN_FILE",
                PATH,
                "",
                "File holding the metrics token, when METRICS_TOKEN is unset.",
                read_as="settings.METRICS_TOKEN",
            ),
            _s(
                "METRICS_TENANT_LABELS",
                INT,
                20,
                "Per-tenant series cover at most this many tenants; the rest are summed.",
                minimum=0,
            ),
            _s(
                "METRICS_PROVIDER_LABELS",
                INT,
                50,
                "Per-provider series cover at most this many providers.",
                minimum=0,
                read_as="ledger.platform.telemetry",
            ),
            _s(
                "METRICS_REVISION_LABELS",
                INT,
                200,
                "Per-revision series cover at most this many revisions.",
                minimum=0,
                read_as="ledger.platform.telemetry",
            ),
            _s(
                "SCHEDULER_STALE_SECONDS",
                INT,
                300,
                "No django-q2 task finished for this long: onceguard_scheduler_stale=1 and an alert.",
                minimum=1,
            ),
            _s(
                "SWEEPER_STALE_SECONDS",
                INT,
                0,
                "The same for the sweeper; 0: five sweep intervals, at least 300 s.",
                minimum=0,
            ),
        ),
        *_group(
            "Dead-letter queue",
            "dlq.conf (ONCEGUARD_DLQ overrides)",
            _s("DLQ_MAX_EVENT_BYTES", INT, 256 * 1024, "Ingest bodies over this are refused with 413.", minimum=1),
            _s(
                "DLQ_SEARCH_PATHS",
                LIST,
                [
                    "event_type",
                    "action",
                    "source",
                    "method",
                    "path",
                    "workflow.id",
                    "workflow.name",
                    "execution.mode",
                    "execution.lastNodeExecuted",
                    "call.agent_id",
                    "call.disconnection_reason",
                ],
                """Dotted JSON paths whose scalar values are copied in plain text into
                search_fields. Only non-personal paths belong here.""",
            ),
            _s(
                "DLQ_AUTO_REPLAY_MAX_PER_ROOT",
                INT,
                3,
                "At most this many automatic replays per lineage root …",
                minimum=0,
            ),
            _s(
                "DLQ_AUTO_REPLAY_LIFETIME_SECONDS",
                INT,
                24 * 3600,
                "… and only while the root failed less than this long ago.",
                minimum=0,
            ),
            _s(
                "DLQ_AUTO_REPLAY_BASE_DELAY_SECONDS",
                INT,
                60,
                "Minimum wait after a root's last replay before the schedule tries again (× 2^n).",
                minimum=0,
            ),
            _s("DLQ_AUTO_REPLAY_BATCH", INT, 50, "Entries handled per automatic-replay run.", minimum=1),
            _s("DLQ_BULK_REPLAY_PER_SECOND", INT, 5, "Bulk replays are sent at most this fast.", minimum=1),
            _s("DLQ_BULK_MAX_SELECTION", INT, 10_000, "A dry run freezes at most this many entries.", minimum=1),
            _s(
                "DLQ_BULK_DRY_RUN_TTL_SECONDS",
                INT,
                3600,
                "A dry run's selection must be confirmed within this.",
                minimum=1,
            ),
            _s(
                "DLQ_BULK_TASK_BUDGET_SECONDS",
                INT,
                60,
                "One bulk task run stops after this long and re-enqueues itself (< Q_TIMEOUT).",
                minimum=1,
            ),
            _s(
                "DLQ_REPLAYING_STALE_SECONDS",
                INT,
                300,
                "An entry still replaying after this long (sender died) is settled by the recovery pass.",
                minimum=1,
            ),
            _s(
                "DLQ_RESPONSE_KEEP_BYTES",
                INT,
                16 * 1024,
                "Response bodies of replay targets are kept up to this many bytes.",
                minimum=0,
            ),
            _s(
                "DLQ_REPLAY_ALLOW_HTTP",
                INT,
                0,
                """1: replay targets (and their lookups) may be plain http on other hosts than this
                machine. Off by default: a replay carries the target's credential and the entry's data.""",
                minimum=0,
            ),
            _s(
                "DLQ_REPLAY_SECRET_OVERLAP_SECONDS",
                INT,
                86400,
                "After a target's signing secret is rotated, the previous one also signs this long.",
                minimum=0,
            ),
            _s(
                "DLQ_REPLAY_LOOKUP_TIMEOUT_SECONDS",
                INT,
                5,
                "A target's lookup (a search by the business key before a replay) may take this long.",
                minimum=1,
            ),
        ),
        *_group(
            "Alerts",
            "alerts.conf (ONCEGUARD_ALERTS overrides)",
            _s(
                "ALERT_MAX_ATTEMPTS",
                INT,
                5,
                "Delivery attempts of one alert.",
                minimum=1,
                former_names=("DLQ_ALERT_MAX_ATTEMPTS",),
            ),
            _s(
                "ALERT_RETRY_BASE_SECONDS",
                INT,
                30,
                "First delay between deliveries (doubling).",
                minimum=0,
                former_names=("DLQ_ALERT_RETRY_BASE_SECONDS",),
            ),
            _s(
                "ALERT_CONSOLE_BASE_URL",
                STR,
                "http://127.0.0.1:8000",
                "Alert messages link here (/admin/…).",
                former_names=("DLQ_CONSOLE_BASE_URL",),
            ),
        ),
        *_group(
            "make run, the web server and the demo",
            "",
            _s(
                "DEMO",
                BOOL,
                True,
                "make run seeds and starts the demo receivers (0: not).",
                read_as="run_all, demo_seed",
            ),
            _s(
                "DEMO_PORT_BASE",
                INT,
                8010,
                "First port of the demo receivers (mocks and relays on base … base + 5).",
                minimum=1,
                read_as="run_all, bootstrap_demo, review.demo",
            ),
            _s(
                "PORT",
                INT,
                8000,
                "The web port of make run and scripts/web.sh.",
                minimum=0,
                read_as="run_all, scripts/web.sh",
            ),
            _s(
                "HOST",
                STR,
                "127.0.0.1",
                "make run's web address (scripts/web.sh's default: 0.0.0.0).",
                read_as="run_all, scripts/web.sh",
            ),
            _s(
                "WEB_WORKERS",
                INT,
                4,
                "granian worker processes of scripts/web.sh (the production web server).",
                minimum=1,
                read_as="scripts/web.sh",
            ),
            _s(
                "WEB_THREADS",
                INT,
                4,
                "granian blocking threads per worker process of scripts/web.sh.",
                minimum=1,
                read_as="scripts/web.sh",
            ),
            _s("EXEC_WORKERS", INT, 1, "make run's execute-mode workers.", minimum=0, read_as="run_all"),
            _s(
                "QCLUSTER_STOP_SECONDS",
                FLOAT,
                2.0,
                "make run waits this long for django-q2 to stop.",
                minimum=0,
                read_as="run_all",
            ),
            _s(
                "WORKER_STOP_SECONDS",
                FLOAT,
                120.0,
                "make run waits this long for a worker to finish its attempt.",
                minimum=0,
                read_as="run_all",
            ),
            _s(
                "READY_TIMEOUT_SECONDS",
                FLOAT,
                60.0,
                "make run waits this long for the web app to answer /readyz.",
                minimum=0,
                read_as="run_all",
            ),
            _s(
                "RELAY_MODE",
                STR,
                "forward-and-respond",
                "The fault relay's mode (relay.fault_relay.MODES; its command refuses any other).",
                read_as="relay",
            ),
            _s("RELAY_DELAY", FLOAT, 0.0, "The fault relay's delay (seconds).", minimum=0, read_as="relay"),
        ),
    ]
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def raw(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable's text as set (a former name's when it is unset); "" when neither is."""
    environ = os.environ if environ is None else environ
    setting = BY_NAME[name]
    value = environ.get(name)
    if not value:
        for former in setting.former_names:
            if environ.get(former):
                return environ[former]
    return value or ""


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The declared setting ``name`` from ``environ`` (the process's environment by default):
    its default when unset or empty, else its value parsed and checked; SettingError
    (ImproperlyConfigured) with a message naming the variable when it is not valid. Cheap
    enough to call per use (the key rings call it on every seal)."""
    setting = BY_NAME[name]
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    if not value:
        if value == "" and setting.blank_is_value:
            return [] if setting.kind in (LIST, CIDRS, REGEX_LINES) else ""
        if not setting.former_names:
            return setting.default
        value = next((environ[f] for f in setting.former_names if environ.get(f)), "")
        if not value:
            return setting.default
    return setting.parse(value)


def validate(environ: Mapping[str, str] | None = None, names: Iterable[str] | None = None) -> None:
    """Read every declared setting once; one SettingError listing each bad variable."""
    problems = []
    for name in BY_NAME if names is None else names:
        try:
            read(name, environ)
        except SettingError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingError("Bad settings in the environment:\n  " + "\n  ".join(problems))


def reference_markdown() -> str:
    """docs/reference/settings.md: the table, one section per group."""
    out = [
        "# Settings reference",
        "",
        "<!-- Generated from ledger/platform/env.py by `python manage.py settings_reference`; do not edit. -->",
        "",
        "Every setting the service reads from the environment. An unset or empty variable takes",
        "its default; a value the setting does not accept stops the start with a message naming",
        "the variable. Secrets are marked; keep them out of files under version control",
        "(docs/secrets.md).",
        "",
    ]
    groups: dict[str, list[Setting]] = {}
    for s in SETTINGS:
        groups.setdefault(s.group, []).append(s)
    for group, settings in groups.items():
        out += [f"## {group}", "", "| Variable | Accepts | Default | Meaning | Read as |", "|---|---|---|---|---|"]
        for s in settings:
            meaning = s.meaning
            if s.secret:
                meaning += " **Secret.**"
            if s.former_names:
                meaning += " Former name: " + ", ".join(f"`{n}`" for n in s.former_names) + "."
            default = s.default_shown()
            if not s.default_text and default not in ("(unset)", "(empty)"):
                default = f"`{default}`"
            cells = [f"`{s.name}`", s.accepts(), default, meaning, s.read_as]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)
