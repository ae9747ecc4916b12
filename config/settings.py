"""Onceguard settings: one module, every difference driven by the environment.

Defaults are safe for the embedded mode (SQLite file under ``var/``); production sets
``DATABASE_URL``, ``SECRET_KEY``, ``DEBUG=0`` and ``ALLOWED_HOSTS``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ledger.platform import env, local_env
from ledger.platform.logs import logging_config
from ledger.platform.secret_files import read_or_create_secret_file

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.read("ONCEGUARD_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)
# The demo's var/local.env (written by `make run`), read before any setting below and only
# under the demo settings; real environment variables win (ledger.platform.local_env).
LOCAL_ENV_FROM_FILE = local_env.load(VAR_DIR)
# The demo settings (embedded database, DEBUG not off): the sign-in page shows the demo
# admin's login from var/credentials.txt. Never under production settings.
DEMO_SETTINGS = local_env.applies(os.environ) and not local_env.in_test_suite()
# Every variable below is declared, typed and explained once in ledger.platform.env (and in
# docs/reference/settings.md, generated from it): a bad value stops the start here, with a
# message naming each bad variable and what it accepts.
env.validate()


def _secret_key() -> str:
    """SECRET_KEY from the environment, else a local one generated once under var/."""
    if env.read("SECRET_KEY"):
        return env.read("SECRET_KEY")
    # Mode 600 from birth, never half-written; two processes starting at once agree on one.
    return read_or_create_secret_file(VAR_DIR / "secret_key", secrets.token_urlsafe(50))


SECRET_KEY = _secret_key()
DEBUG = env.read("DEBUG")
ALLOWED_HOSTS = env.read("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env.read("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    # The stock admin with the console's site (tenant scoping, masking, dashboard).
    "review.adminconfig.OnceguardAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    # Second factors of the console's local accounts (review.staff.mfa, ADR 0014).
    "django_otp",
    "django_otp_webauthn",
    "ledger",
    "alerts",
    "dlq",
    "review",
    "relay",
    "observability",
]

MIDDLEWARE = [
    # Errors and slow requests only, one line each, when REQUEST_LOG_SLOW_MS is set (make run).
    "config.middleware.QuietRequestLogMiddleware",
    # Persistent connections the database server hung up on are dropped before any query,
    # the probes' included (no round trip; a database error later in the request is a 503).
    "config.middleware.DeadConnectionMiddleware",
    # /healthz and /readyz answer before host validation, sessions and auth (observability.health).
    "observability.health.HealthProbeMiddleware",
    # Continues an incoming W3C traceparent as the request's server span; not in the chain at
    # all while tracing is off (ADR 0015). After the probes: they are not traced.
    "config.middleware.TraceContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "review.staff.security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.middleware.ApiBodyLimitMiddleware",
    "config.middleware.QueryNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The device that verified this session (django-otp), then the console's demand for one.
    "django_otp.middleware.OTPMiddleware",
    "review.staff.mfa.ConsoleMfaMiddleware",
    "review.staff.tenancy.TenantScopeMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
# SQLite is the embedded default: WAL so readers never block the writer, a busy timeout
# and BEGIN IMMEDIATE so web and worker processes queue for the write lock instead of
# failing with "database is locked" half-way through a transaction.
SQLITE_PATH = env.read("SQLITE_PATH") or str(VAR_DIR / "onceguard.sqlite3")
DATABASE_URL = env.read("DATABASE_URL")
if DATABASE_URL:
    # Persistent connections without a per-request `SELECT 1`: a connection the server hung
    # up on is dropped before use by config.middleware.DeadConnectionMiddleware (no round
    # trip), one that breaks mid-request answers 503 and is replaced; a connect gives up
    # after DB_CONNECT_TIMEOUT_SECONDS instead of hanging on an unreachable host (libpq's
    # minimum is 2). Server-side binding so psycopg prepares the ledger's
    # repeated statements after PG_PREPARE_THRESHOLD uses: the planner work of a claim or
    # completion drops by more than half. Behind PgBouncer in transaction mode use >= 1.21
    # (protocol-level prepared statements) or set PG_PREPARE_THRESHOLD=0 to disable.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL, conn_max_age=600, conn_health_checks=env.read("DB_HEALTH_CHECKS")
        )
    }
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", env.read("DB_CONNECT_TIMEOUT_SECONDS"))
    _prepare = env.read("PG_PREPARE_THRESHOLD")
    if _prepare > 0:
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            {"server_side_binding": True, "prepare_threshold": _prepare}
        )
    if env.read("PG_TEST_DB_NAME"):
        # Lets parallel test runs on one server use separate test databases.
        DATABASES["default"]["TEST"] = {"NAME": env.read("PG_TEST_DB_NAME")}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
            },
            # A file, not :memory:, so threads and child processes in tests share it.
            "TEST": {"NAME": env.read("SQLITE_TEST_PATH") or str(VAR_DIR / "test.sqlite3")},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One date format everywhere in the console: "2026-12-01 18:42:19 UTC" (config/formats).
FORMAT_MODULE_PATH = ["config.formats"]
# Phone numbers typed without a country code ("0412 345 678") are read as numbers of this
# region (ISO 3166 code, e.g. AU) by the data-subject index and search (ledger.platform.crypto);
# empty: such numbers keep their digits as they are.
DEFAULT_PHONE_REGION = env.read("DEFAULT_PHONE_REGION").strip().upper()

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
# Serve app static files straight from their apps: no collectstatic step to forget.
WHITENOISE_USE_FINDERS = True


def _object_storage(*, backend_env: str, options_env: str, location: Path) -> dict[str, object]:
    """A storage alias for tenant objects (ledger.execution.objects): local files under ``location``
    (mode 600 in 700 folders; nothing serves them by URL: only the tenant-scoped API views
    read them) unless ``backend_env`` names another Django
    storage backend — e.g. django-storages' ``storages.backends.s3.S3Storage`` — configured
    by the JSON object in ``options_env``."""
    backend = env.read(backend_env) or "django.core.files.storage.FileSystemStorage"
    if backend == "django.core.files.storage.FileSystemStorage":
        options: dict[str, object] = {
            "location": str(location),
            "file_permissions_mode": 0o600,
            "directory_permissions_mode": 0o700,
        }
    else:
        options = {}
    options.update(env.read(options_env))
    return {"BACKEND": backend, "OPTIONS": options}


STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # Uploads and published outputs: readable only through the API (ledger.execution.objects).
    "onceguard_objects": _object_storage(
        backend_env="OBJECT_STORAGE_BACKEND",
        options_env="OBJECT_STORAGE_OPTIONS",
        location=Path(env.read("OBJECT_STORAGE_DIR") or VAR_DIR / "objects"),
    ),
    # Fetched outputs before their checks pass: never readable, deleted after the verdict.
    "onceguard_quarantine": _object_storage(
        backend_env="QUARANTINE_STORAGE_BACKEND",
        options_env="QUARANTINE_STORAGE_OPTIONS",
        location=Path(env.read("QUARANTINE_STORAGE_DIR") or VAR_DIR / "quarantine"),
    ),
}

LOGIN_URL = "/admin/login/"

# --- Console sign-in (ADR 0014): single sign-on, and the second factor of local accounts -----
# Passwords for local accounts; the provider's sign-in (review.staff.oidc) acts only on its own
# callback and only when OIDC_RP_CLIENT_ID and CONSOLE_OIDC_ISSUER are set.
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "review.staff.oidc.ConsoleOidcBackend",
]
OIDC_RP_CLIENT_ID = env.read("OIDC_RP_CLIENT_ID")
OIDC_RP_CLIENT_SECRET = env.read("OIDC_RP_CLIENT_SECRET")
CONSOLE_OIDC_ISSUER = env.read("CONSOLE_OIDC_ISSUER")
OIDC_OP_AUTHORIZATION_ENDPOINT = env.read("OIDC_OP_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = env.read("OIDC_OP_TOKEN_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = env.read("OIDC_OP_JWKS_ENDPOINT")
OIDC_OP_USER_ENDPOINT = env.read("OIDC_OP_USER_ENDPOINT")
OIDC_RP_SIGN_ALGO = env.read("OIDC_RP_SIGN_ALGO")
OIDC_RP_SCOPES = env.read("OIDC_RP_SCOPES")
OIDC_TIMEOUT = env.read("OIDC_TIMEOUT")
# The code flow with a nonce and PKCE (S256): an intercepted code is useless without the
# verifier kept in this browser's session.
OIDC_USE_NONCE = True
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_AUTHENTICATION_CALLBACK_URL = "admin:onceguard_oidc_callback"
OIDC_CREATE_USER = True
OIDC_STORE_ACCESS_TOKEN = False
OIDC_STORE_ID_TOKEN = False
LOGIN_REDIRECT_URL = "/admin/"
CONSOLE_OIDC_ROLE_CLAIM = env.read("CONSOLE_OIDC_ROLE_CLAIM")
CONSOLE_OIDC_ROLE_MAP = env.read("CONSOLE_OIDC_ROLE_MAP")
CONSOLE_OIDC_TENANT_CLAIM = env.read("CONSOLE_OIDC_TENANT_CLAIM")
CONSOLE_REQUIRE_MFA = env.read("CONSOLE_REQUIRE_MFA")
CONSOLE_MFA_EXEMPT_USERS = env.read("CONSOLE_MFA_EXEMPT_USERS")
CONSOLE_MFA_MAX_FAILURES = env.read("CONSOLE_MFA_MAX_FAILURES")
CONSOLE_WEBAUTHN_RP_ID = env.read("CONSOLE_WEBAUTHN_RP_ID")
CONSOLE_WEBAUTHN_ORIGINS = env.read("CONSOLE_WEBAUTHN_ORIGINS")
OTP_WEBAUTHN_RP_ID = CONSOLE_WEBAUTHN_RP_ID or "localhost"
OTP_WEBAUTHN_RP_NAME = "Onceguard console"
OTP_WEBAUTHN_ALLOWED_ORIGINS = CONSOLE_WEBAUTHN_ORIGINS or [f"https://{OTP_WEBAUTHN_RP_ID}"]
# A security key is a second factor here, never a password's replacement.
OTP_WEBAUTHN_ALLOW_PASSWORDLESS_LOGIN = False

# --- Security -------------------------------------------------------------------------
SESSION_COOKIE_AGE = env.read("SESSION_COOKIE_AGE")
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Console sessions end when the browser closes and at most SESSION_COOKIE_AGE after sign-in.
SESSION_EXPIRE_AT_BROWSER_CLOSE = env.read("SESSION_EXPIRE_AT_BROWSER_CLOSE")
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
# Secure cookies + HSTS whenever DEBUG is off and the service answers to a non-loopback host
# (so it sits behind TLS). The embedded default on plain-http loopback keeps them off, or
# the browser would never send the session cookie back; SECURE_COOKIES=1/0 decides explicitly.
_LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}
SECURE_COOKIES = env.read("SECURE_COOKIES")
if SECURE_COOKIES is None:
    SECURE_COOKIES = not DEBUG and any(h not in _LOOPBACK_HOSTS for h in ALLOWED_HOSTS)
if not DEBUG and SECURE_COOKIES:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.read("SECURE_HSTS_SECONDS")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Plain-http requests are redirected to https (the TLS proxy sets X-Forwarded-Proto);
    # the load balancer's /healthz and /readyz are answered before this redirect.
    SECURE_SSL_REDIRECT = env.read("SECURE_SSL_REDIRECT")
    # HSTS sent by the service's own host covers only that host's subdomains, and preload
    # takes effect only when the registrable domain itself is submitted: safe defaults.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.read("SECURE_HSTS_INCLUDE_SUBDOMAINS")
    SECURE_HSTS_PRELOAD = env.read("SECURE_HSTS_PRELOAD")

# The deployment's own reverse proxies (comma-separated CIDRs): only a request from one of
# them has its X-Forwarded-For read for the client's address (login throttling, access log).
TRUSTED_PROXIES = env.read("TRUSTED_PROXIES")

# Bodies larger than this are refused with 413 before anything is parsed or stored.
MAX_REQUEST_BYTES = env.read("MAX_REQUEST_BYTES")
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BYTES

# --- API ------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["ledger.tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["ledger.tenants.auth.HasApiKeyScope"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["config.parsers.BoundedJSONParser"],
    # DRF's negotiation with the common cases short-cut (measured in its docstring).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "config.negotiation.JsonFastNegotiation",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "config.problems.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Onceguard API",
    "DESCRIPTION": "Idempotency ledger: side effects happen once, or visibly not.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    # Swagger UI served from our own static files: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Ledger ---------------------------------------------------------------------------
ONCEGUARD = {
    # Per-process caches of API keys and providers (seconds; 0 disables): a revoked key or a
    # changed provider takes effect within this long on every node.
    # Payload/request paths copied in plain text into Operation.search_fields for filtering
    # (`?match=path:value`). Only non-personal paths belong here.
    "OPERATION_SEARCH_PATHS": env.read("OPERATION_SEARCH_PATHS"),
    "API_KEY_CACHE_SECONDS": env.read("API_KEY_CACHE_SECONDS"),
    "PROVIDER_CACHE_SECONDS": env.read("PROVIDER_CACHE_SECONDS"),
    # Adapter revisions never change once written: a process keeps the ones it used this long.
    "ADAPTER_REVISION_CACHE_SECONDS": env.read("ADAPTER_REVISION_CACHE_SECONDS"),
    # Prompt template versions are immutable too (ledger.providers.prompts); "the newest" is never cached.
    "PROMPT_TEMPLATE_CACHE_SECONDS": env.read("PROMPT_TEMPLATE_CACHE_SECONDS"),
    # A workflow name this process has noted is not written again for this long (ledger.tenants.workflows).
    "WORKFLOW_NAME_CACHE_SECONDS": env.read("WORKFLOW_NAME_CACHE_SECONDS"),
    # A caller's lease wish is clamped into this range (seconds).
    "LEASE_MIN_SECONDS": env.read("LEASE_MIN_SECONDS"),
    "LEASE_MAX_SECONDS": env.read("LEASE_MAX_SECONDS"),
    "LEASE_DEFAULT_SECONDS": env.read("LEASE_DEFAULT_SECONDS"),
    # Sweeper: how long a pass holds a row it reconciles, how many failed lookups before a
    # human is asked, and when an open row counts as stuck (one alert per row).
    "RECONCILE_LEASE_SECONDS": env.read("RECONCILE_LEASE_SECONDS"),
    "LOOKUP_FAILURE_LIMIT": env.read("LOOKUP_FAILURE_LIMIT"),
    "STUCK_ALERT_SECONDS": env.read("STUCK_ALERT_SECONDS"),
    "SWEEP_INTERVAL_SECONDS": env.read("SWEEP_INTERVAL_SECONDS"),
    # Restore fencing (ADR 0012, ledger.protocol.fencing): the journal outside the database of
    # the keys whose effect may have happened, and how often the epoch advances.
    "FENCE_JOURNAL": env.read("FENCE_JOURNAL"),
    "FENCE_JOURNAL_DIR": str(env.read("FENCE_JOURNAL_DIR") or VAR_DIR / "fence-journal"),
    "FENCE_REDIS_URL": env.read("FENCE_REDIS_URL"),
    "FENCE_JOURNAL_FSYNC": env.read("FENCE_JOURNAL_FSYNC"),
    "FENCE_JOURNAL_RETENTION_DAYS": env.read("FENCE_JOURNAL_RETENTION_DAYS"),
    "FENCE_EPOCH_SECONDS": env.read("FENCE_EPOCH_SECONDS"),
    "NODES": env.read("NODES"),
    # A row waiting on an asynchronous provider past its lifetime whose poll is this overdue
    # (no worker took it) goes to review (ledger.recovery.sweeper.review_unpolled_waits).
    "POLL_OVERDUE_SECONDS": env.read("POLL_OVERDUE_SECONDS"),
    # Execute mode. A worker's lease is 2 × the provider's timeout + RECORD_RETRY_SECONDS +
    # this margin, so attempt timeout < lease < django-q2 timeout (Q_TIMEOUT) < django-q2
    # retry (Q_RETRY). A poll of an asynchronous provider's job holds a shorter lease: the
    # provider's timeout + OUTPUT_FETCH_TIMEOUT_SECONDS + this margin (adapters.poll_lease_seconds).
    "WORKER_LEASE_MARGIN_SECONDS": env.read("WORKER_LEASE_MARGIN_SECONDS"),
    # How long a worker holding a provider's answer retries recording it while the database
    # is unreachable (fresh connection, same token, backing off) before leaving the row to the
    # sweeper. Part of the lease, so a longer budget delays the recovery of a crashed worker.
    "RECORD_RETRY_SECONDS": env.read("RECORD_RETRY_SECONDS"),
    # A provider's Retry-After is honoured up to this, or up to the provider's own
    # max_delay_seconds when that is longer (ledger.providers.adapters.retry_after_cap).
    "RETRY_AFTER_MAX_SECONDS": env.read("RETRY_AFTER_MAX_SECONDS"),
    # Provider rate caps (ledger.providers.ratelimit): a 429 (or a 503 with Retry-After) multiplies a
    # rate-capped provider's effective rate by PROVIDER_RATE_DECREASE, never below
    # PROVIDER_RATE_FLOOR_FRACTION of its declared rate; after PROVIDER_RATE_RECOVERY_SECONDS
    # without one it climbs back by PROVIDER_RATE_STEP_FRACTION of the declared rate, one step
    # per quiet period (from half to full in five steps: 150 s by default).
    "PROVIDER_RATE_DECREASE": env.read("PROVIDER_RATE_DECREASE"),
    "PROVIDER_RATE_FLOOR_FRACTION": env.read("PROVIDER_RATE_FLOOR_FRACTION"),
    "PROVIDER_RATE_RECOVERY_SECONDS": env.read("PROVIDER_RATE_RECOVERY_SECONDS"),
    "PROVIDER_RATE_STEP_FRACTION": env.read("PROVIDER_RATE_STEP_FRACTION"),
    # Provider concurrency (ledger.providers.ratelimit, ADR 0008): the same answers halve a
    # provider's effective in-flight limit (down to 1), declared cap or not; it climbs back by 1
    # per quiet period (the provider's concurrency_recovery_seconds, else
    # PROVIDER_CONCURRENCY_RECOVERY_SECONDS) up to its max_in_flight, or
    # PROVIDER_DEFAULT_MAX_IN_FLIGHT for a provider that declared none.
    "PROVIDER_DEFAULT_MAX_IN_FLIGHT": env.read("PROVIDER_DEFAULT_MAX_IN_FLIGHT"),
    "PROVIDER_CONCURRENCY_RECOVERY_SECONDS": env.read("PROVIDER_CONCURRENCY_RECOVERY_SECONDS"),
    # Fair admission at the workers' take (ledger.execution.fairness, ADR 0021): a system-wide
    # in-flight cap, and each tenant's default cap and round-robin share with the bound of a
    # tenant's own share (its own cap never exceeds the default).
    "EXECUTE_MAX_IN_FLIGHT": env.read("EXECUTE_MAX_IN_FLIGHT"),
    "EXECUTE_TENANT_MAX_IN_FLIGHT": env.read("EXECUTE_TENANT_MAX_IN_FLIGHT"),
    "EXECUTE_TENANT_SHARE": env.read("EXECUTE_TENANT_SHARE"),
    "EXECUTE_TENANT_MAX_SHARE": env.read("EXECUTE_TENANT_MAX_SHARE"),
    # Retry-After of the API's 503 `database_unavailable` answer.
    "DATABASE_RETRY_AFTER_SECONDS": env.read("DATABASE_RETRY_AFTER_SECONDS"),
    # Largest stored request envelope (method/path/query/headers/body as canonical JSON).
    "EXECUTE_MAX_REQUEST_BYTES": env.read("EXECUTE_MAX_REQUEST_BYTES"),
    "WORKER_MAX_RESPONSE_BYTES": env.read("WORKER_MAX_RESPONSE_BYTES"),
    # Where the service may send (ledger.rules.outbound): comma-separated host names, *.suffixes,
    # addresses or CIDRs, each with an optional :port or :first-last. Loopback, private,
    # link-local and the like are refused unless listed here; cloud metadata addresses only
    # when listed exactly. Public addresses are allowed unless OUTBOUND_ALLOW_PUBLIC=0.
    # Proxy variables (HTTP(S)_PROXY) are ignored by every outbound call.
    # DEMO_OUTBOUND_ALLOW: the demo receivers' ports, added by `make run` (var/local.env).
    "OUTBOUND_ALLOW": ",".join(r for r in (env.read("OUTBOUND_ALLOW"), env.read("DEMO_OUTBOUND_ALLOW")) if r.strip()),
    "OUTBOUND_ALLOW_PUBLIC": env.read("OUTBOUND_ALLOW_PUBLIC"),
    # A provider's credential read from the environment must be named
    # <prefix><TENANT>_<anything> (ledger.providers.credentials); anything else is never read.
    "PROVIDER_SECRET_PREFIX": env.read("ONCEGUARD_PROVIDER_SECRET_PREFIX"),
    # After a callback secret is rotated the previous one still signs for this long.
    "CALLBACK_SECRET_OVERLAP_SECONDS": env.read("CALLBACK_SECRET_OVERLAP_SECONDS"),
    # A re-send waiting for a second person's approval expires unanswered after this long (ADR 0013).
    "APPROVAL_TTL_SECONDS": env.read("APPROVAL_TTL_SECONDS"),
    "CALLBACK_TIMEOUT_SECONDS": env.read("CALLBACK_TIMEOUT_SECONDS"),
    "CALLBACK_MAX_ATTEMPTS": env.read("CALLBACK_MAX_ATTEMPTS"),
    # Eligibility rechecks (ledger.recovery.eligibility): how long the tenant's webhook may take to
    # answer "still wanted?", and how long a retry that got no answer waits before it is asked again.
    "ELIGIBILITY_TIMEOUT_SECONDS": env.read("ELIGIBILITY_TIMEOUT_SECONDS"),
    "ELIGIBILITY_ASK_INTERVAL_SECONDS": env.read("ELIGIBILITY_ASK_INTERVAL_SECONDS"),
    # The canary watch (ledger.providers.canary): a running canary revision is rolled back on its own
    # once it has CANARY_MIN_SAMPLE counted attempts within the last CANARY_WINDOW_SECONDS and
    # its failure rate exceeds the stable revision's by more than CANARY_MAX_EXCESS_PERCENT
    # points (provider-side failures only: not throttling, not the caller's invalid input).
    "CANARY_WINDOW_SECONDS": env.read("CANARY_WINDOW_SECONDS"),
    "CANARY_MIN_SAMPLE": env.read("CANARY_MIN_SAMPLE"),
    "CANARY_MAX_EXCESS_PERCENT": env.read("CANARY_MAX_EXCESS_PERCENT"),
    # Its gates beyond the failure rate pause it instead (ADR 0020): p95 latency against the
    # stable revision's, and consumers' rejected or low-scored outputs. Defaults; a revision
    # may set its own thresholds when it starts as a canary.
    "CANARY_LATENCY_P95_MAX_RATIO": env.read("CANARY_LATENCY_P95_MAX_RATIO"),
    "CANARY_MAX_REJECTED_EXCESS_PERCENT": env.read("CANARY_MAX_REJECTED_EXCESS_PERCENT"),
    "CANARY_MIN_SCORE": env.read("CANARY_MIN_SCORE"),
    # Identifier shapes of this deployment masked in stored error text besides e-mail
    # addresses, phone numbers, tokens and keys (ledger.platform.redaction): regular expressions, one
    # per line, e.g. ERROR_SCRUB_PATTERNS='\bCUST-\d{8}\b'. Compiled here so a bad one
    # stops the start, not every failure record.
    # Uploads (POST /api/v1/uploads, ledger.execution.uploads): the largest file taken, counted while
    # it streams in (refused as soon as it is passed), and the media types taken, recognised
    # by their content (magic bytes, then decoded by Pillow), never by the client's header.
    "UPLOAD_MAX_BYTES": env.read("UPLOAD_MAX_BYTES"),
    "UPLOAD_MEDIA_TYPES": env.read("UPLOAD_MEDIA_TYPES"),
    # Images with more pixels than this are refused before they are decoded (a small file
    # can declare a huge canvas: a decompression bomb).
    "IMAGE_MAX_PIXELS": env.read("IMAGE_MAX_PIXELS"),
    # Validated outputs (ledger.execution.outputs): the largest output fetched, and how long a fetch may take.
    "OUTPUT_MAX_BYTES": env.read("OUTPUT_MAX_BYTES"),
    "OUTPUT_FETCH_TIMEOUT_SECONDS": env.read("OUTPUT_FETCH_TIMEOUT_SECONDS"),
    "ERROR_SCRUB_PATTERNS": env.read("ERROR_SCRUB_PATTERNS"),
}

# --- Access log (review.audit.accesslog) ------------------------------------------------------
# The chain is keyed with ONCEGUARD_ACCESSLOG_KEYS (`<id>:<secret>,…`, first = current),
# else the file ONCEGUARD_ACCESSLOG_KEY_FILE, else var/accesslog.key (made by `make run`);
# never in the database.
ONCEGUARD_ACCESS_LOG = {
    # The platform's floor: no tenant's policy, and no purge, removes a younger row.
    "MIN_RETENTION_DAYS": env.read("ACCESS_LOG_MIN_RETENTION_DAYS"),
    # Signed checkpoints of every chain's head: this often (django-q2), and at least every
    # HEARTBEAT_HOURS even when nothing happened; `accesslog_verify` reports rows left
    # uncovered longer than CHECKPOINT_MINUTES + GRACE_MINUTES and a newest checkpoint
    # older than HEARTBEAT_HOURS + that. Rows newer than the last checkpoint are covered by
    # their accesslog_witness log lines (`accesslog_verify --log FILE`, review.audit.accesslog_witness).
    "CHECKPOINT_MINUTES": env.read("ACCESS_LOG_CHECKPOINT_MINUTES"),
    "CHECKPOINT_HEARTBEAT_HOURS": env.read("ACCESS_LOG_CHECKPOINT_HEARTBEAT_HOURS"),
    "GRACE_MINUTES": env.read("ACCESS_LOG_CHECKPOINT_GRACE_MINUTES"),
}

# --- Retention (review.retention.policies): the Australian defaults and the platform's floors
# A tenant without a policy for a record type gets these (RETENTION_APPLY_DEFAULTS=0: keep
# everything until a policy says otherwise). Days; None = never. APP 11.2 asks to destroy or
# de-identify personal information once no purpose needs it: payloads are only needed while
# an effect may be retried, replayed or reviewed, the de-identified record (key, states,
# times, digests) as evidence. Where each number comes from: docs/design.md §8, "Retention".
ONCEGUARD_RETENTION = {
    "APPLY_DEFAULTS": env.read("RETENTION_APPLY_DEFAULTS"),
    "DEFAULTS": {
        "operations": {
            "payload_days": env.read("RETENTION_OPERATIONS_PAYLOAD_DAYS"),
            "record_days": env.read("RETENTION_OPERATIONS_RECORD_DAYS"),
        },
        "failed_events": {
            "payload_days": env.read("RETENTION_DLQ_PAYLOAD_DAYS"),
            "record_days": env.read("RETENTION_DLQ_RECORD_DAYS"),
        },
        "access_log": {"payload_days": None, "record_days": env.read("RETENTION_ACCESS_LOG_RECORD_DAYS")},
    },
    # Failed attempts' evidence (ADR 0016) holds no personal data and outlives the operations'
    # record TTL: by default as long as the access log, so a post-mortem can read what failed
    # for as long as it can read who looked.
    "EVIDENCE_DAYS": env.read("FAILED_ATTEMPT_EVIDENCE_DAYS") or env.read("RETENTION_ACCESS_LOG_RECORD_DAYS"),
    # No tenant's policy may be shorter (the console form and retention_policy_save refuse
    # it); the access log's floor is ACCESS_LOG_MIN_RETENTION_DAYS, and the purge holds it too.
    "FLOORS": {
        "operations": {
            "payload_days": env.read("RETENTION_FLOOR_OPERATIONS_PAYLOAD_DAYS"),
            "record_days": env.read("RETENTION_FLOOR_OPERATIONS_RECORD_DAYS"),
        },
        "failed_events": {
            "payload_days": env.read("RETENTION_FLOOR_DLQ_PAYLOAD_DAYS"),
            "record_days": env.read("RETENTION_FLOOR_DLQ_RECORD_DAYS"),
        },
    },
}

# --- django-q2: schedules and side channels --------------------------------------------
# timeout < retry, finite attempts; failures land in our own tables, not Q's Failure list.
Q_CLUSTER = {
    "name": "onceguard",
    "orm": "default",
    "workers": env.read("Q_WORKERS"),
    "timeout": env.read("Q_TIMEOUT"),
    "retry": env.read("Q_RETRY"),
    "max_attempts": 3,
    "catch_up": False,
    "save_limit": 500,
    "ack_failures": True,
    "poll": 0.5,
    "log_level": "WARNING",
}
if env.read("Q_REDIS_URL"):
    Q_CLUSTER.pop("orm")
    Q_CLUSTER["redis"] = env.read("Q_REDIS_URL")

# --- Logging: one structlog pipeline for ours, Django's and django-q2's lines -------------
# LOG_FORMAT=json: one JSON object per line; anything else: `<time> <LEVEL> <logger> <event>
# key=value …`. Payloads are never logged; a redaction processor is the second line of
# defence (ledger.platform.logs).
LOG_LEVEL = env.read("LOG_LEVEL")
LOG_FORMAT = env.read("LOG_FORMAT")
# `make run`'s request log: only error answers and requests of at least this many ms (0: off).
REQUEST_LOG_SLOW_MS = env.read("REQUEST_LOG_SLOW_MS")
LOGGING = logging_config(level=LOG_LEVEL, fmt=LOG_FORMAT, q_level=Q_CLUSTER["log_level"])

# --- Health and metrics -------------------------------------------------------------------
# Several processes (web workers, execute workers) add up their latency histograms through
# files in this folder (prometheus-client's multi-process mode): `make run` sets it to
# var/prometheus and empties it at start. It must be set before prometheus_client is
# imported, i.e. in the environment of every process.
PROMETHEUS_MULTIPROC_DIR = env.read("PROMETHEUS_MULTIPROC_DIR")
if PROMETHEUS_MULTIPROC_DIR:
    Path(PROMETHEUS_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
# /metrics (every port it is served on: the web app and `metrics_serve`) answers only a
# scraper sending `Authorization: Bearer <METRICS_TOKEN>`: the token from the environment,
# else the content of the file METRICS_TOKEN_FILE (Prometheus reads the same file with
# `authorization: credentials_file`). Unset: metrics are off (404), since the labels name
# tenants. `make run` creates var/metrics_token for the demo.
METRICS_TOKEN_MIN_LENGTH = 16


def _metrics_token() -> str:
    token = env.read("METRICS_TOKEN").strip()
    if not token and env.read("METRICS_TOKEN_FILE"):
        # A missing or unreadable file stops the start: a scraper would fail silently otherwise.
        token = Path(env.read("METRICS_TOKEN_FILE")).read_text().strip()
    if token and len(token) < METRICS_TOKEN_MIN_LENGTH:
        raise ImproperlyConfigured(f"METRICS_TOKEN must be at least {METRICS_TOKEN_MIN_LENGTH} characters")
    return token


METRICS_TOKEN = _metrics_token()
# Per-tenant metric series cover at most this many tenants (the largest); the rest are summed.
METRICS_TENANT_LABELS = env.read("METRICS_TENANT_LABELS")
# No django-q2 task finished for this long → metric onceguard_scheduler_stale=1 and an alert;
# the sweeper's default is five sweep intervals (at least 300 s).
SCHEDULER_STALE_SECONDS = env.read("SCHEDULER_STALE_SECONDS")
SWEEPER_STALE_SECONDS = env.read("SWEEPER_STALE_SECONDS") or None

# --- Traces (ADR 0015) ----------------------------------------------------------------------
# The export itself is ledger.platform.tracing's (OTEL_EXPORTER_OTLP_ENDPOINT, off by default);
# the console only needs where a trace id links to.
TRACE_LINK_TEMPLATE = env.read("TRACE_LINK_TEMPLATE").strip()
