"""The service's own ground: Django's core settings, the database, object storage, the task
queue (django-q2), and what ``make run``, the web server and the demo read."""

from __future__ import annotations

from ledger.platform.env.declare import (
    BOOL,
    FLOAT,
    INT,
    JSON_OBJECT,
    LIST,
    PATH,
    STR,
    Setting,
    _group,
    _s,
)

CORE: list[Setting] = _group(
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
)


DATABASE: list[Setting] = _group(
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
)


OBJECT_STORAGE: list[Setting] = _group(
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
)


TASK_QUEUE: list[Setting] = _group(
    "Task queue (django-q2)",
    "settings.Q_CLUSTER",
    _s("Q_WORKERS", INT, 2, "django-q2 worker processes.", minimum=1),
    _s("Q_TIMEOUT", INT, 120, "A task running longer is killed (< Q_RETRY).", minimum=1),
    _s("Q_RETRY", INT, 180, "A task not acknowledged after this long is handed out again.", minimum=1),
    _s("Q_REDIS_URL", STR, "", "Redis broker URL. Unset: the database is the broker.", secret=True),
)


RUN: list[Setting] = _group(
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
)
