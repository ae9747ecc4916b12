"""The ledger's own knobs (``settings.ONCEGUARD``): caches, leases, the sweeper, provider
calls and their limits, outbound addresses, callbacks, eligibility, canaries, uploads and
outputs."""

from __future__ import annotations

from ledger.platform.env.declare import (
    BOOL,
    FLOAT,
    INT,
    LIST,
    REGEX_LINES,
    STR,
    Setting,
    _group,
    _s,
)

LEDGER: list[Setting] = _group(
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
        "PROVIDER_DEFAULT_MAX_IN_FLIGHT",
        INT,
        16,
        """After a 429 (or a 503 with Retry-After) a provider's effective in-flight limit halves
        (down to 1) and climbs back by 1 per quiet period up to its max_in_flight; for a provider
        that declared none, up to this (reached, the limit is lifted again).""",
        minimum=1,
    ),
    _s(
        "PROVIDER_CONCURRENCY_RECOVERY_SECONDS",
        FLOAT,
        30.0,
        """The quiet period (no 429) after which a lowered in-flight limit climbs back by 1,
        for a provider that sets no concurrency_recovery_seconds of its own.""",
        minimum=0,
    ),
    _s(
        "EXECUTE_MAX_IN_FLIGHT",
        INT,
        256,
        """Execute-mode operations being sent at once (claimed), all tenants and worker processes
        together: the workers' take stops there (ADR 0021). 0: no system-wide cap.""",
        minimum=0,
    ),
    _s(
        "EXECUTE_TENANT_MAX_IN_FLIGHT",
        INT,
        None,
        """Each tenant's operations being sent at once, unless the tenant's take_max_in_flight is
        lower; also the most a tenant's own value may be (ADR 0021). Empty: a tenant alone may use
        the whole system-wide cap.""",
        minimum=1,
    ),
    _s(
        "EXECUTE_TENANT_SHARE",
        INT,
        1,
        """Rows a tenant gets per round of the workers' round-robin take over the tenants with due
        work, unless its take_share says otherwise (ADR 0021).""",
        minimum=1,
    ),
    _s(
        "EXECUTE_TENANT_MAX_SHARE",
        INT,
        8,
        "The largest take_share a tenant may be given (ADR 0021).",
        minimum=1,
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
    _s(
        "APPROVAL_TTL_SECONDS",
        INT,
        86400,
        """A re-send waiting for a second person's approval (four-eyes, ADR 0013) expires
        unanswered after this long; the requester asks again.""",
        minimum=60,
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
        "CANARY_LATENCY_P95_MAX_RATIO",
        FLOAT,
        2.0,
        "A canary whose p95 latency exceeds the stable revision's times this is paused (a revision may set its own).",
        minimum=1,
    ),
    _s(
        "CANARY_MAX_REJECTED_EXCESS_PERCENT",
        FLOAT,
        10.0,
        "A canary whose share of rejected or low-scored outputs exceeds the stable revision's by more points is paused.",
        minimum=0,
    ),
    _s(
        "CANARY_MIN_SCORE",
        FLOAT,
        0.5,
        "An output verdict scored below this counts as low-scored in the canary's quality gate.",
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
)
