"""Sessions, cookies, TLS, proxies and login limits; the keys that seal secrets and derive
keys; the access log and how long each kind of record is kept."""

from __future__ import annotations

from ledger.platform.env.declare import (
    BOOL,
    CIDRS,
    INT,
    PATH,
    STR,
    Setting,
    _group,
    _s,
)

SECURITY: list[Setting] = _group(
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
        read_as="review.staff.security (ONCEGUARD_SECURITY overrides)",
    ),
    _s(
        "LOGIN_MAX_FAILURES",
        INT,
        5,
        "Failures of one username from one address within the window that lock that pair out.",
        minimum=1,
        read_as="review.staff.security (ONCEGUARD_SECURITY overrides)",
    ),
    _s(
        "LOGIN_MAX_FAILURES_PER_IP",
        INT,
        30,
        "Failures from one address within the window, whatever the usernames, that lock it out.",
        minimum=1,
        read_as="review.staff.security (ONCEGUARD_SECURITY overrides)",
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
        read_as="review.audit.accesslog (per call)",
    ),
    _s(
        "ONCEGUARD_ACCESSLOG_KEY_FILE",
        PATH,
        "",
        "File holding the access log's keys when ONCEGUARD_ACCESSLOG_KEYS is unset.",
        default_text="var/accesslog.key",
        read_as="review.audit.accesslog (per call)",
    ),
)


ACCESS_LOG: list[Setting] = _group(
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
)


RETENTION: list[Setting] = _group(
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
        "FAILED_ATTEMPT_EVIDENCE_DAYS",
        INT,
        None,
        """Failed attempts' evidence (class, status, timing, revision, redacted error; no personal
        data) is kept this long, whatever the operations' retention (ADR 0016).""",
        minimum=1,
        default_text="as RETENTION_ACCESS_LOG_RECORD_DAYS",
        read_as="settings.ONCEGUARD_RETENTION",
    ),
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
)
