"""The operation and its history: one row per logical side effect, its attempts and its
append-only events (both partitioned by month), the admission refusals counted per tenant,
and the tombstone that keeps answering a key after retention deleted its operation."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from ledger.models.fields import Counter, HexBytesField, NewRowId, SealedJSONField
from ledger.models.providers import AdapterRevision, PromptTemplate, Provider
from ledger.models.states import TERMINAL_STATES, AttemptOutcome, ErrorClass, OperationMode, OperationStatus, S
from ledger.models.tenants import Tenant


class Operation(models.Model):
    """One row per logical side effect, unique on (tenant, key)."""

    # No single-column index: (tenant, key) and the tenant composites below cover it. No
    # database constraint on tenant or provider (ADR 0019): its check took a FOR KEY SHARE lock
    # on the one tenant row (and provider row) every claim names, a multixact under load. The
    # ORM's PROTECT still refuses deleting a tenant or provider that has operations, and
    # `ledger_orphans` (nightly) reports any row whose tenant or provider is gone.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="operations", db_index=False, db_constraint=False
    )
    key = models.CharField(max_length=255)
    mode = models.CharField(max_length=8, choices=OperationMode.choices, default=OperationMode.GUARD)
    status = models.CharField(max_length=16, choices=OperationStatus.choices)
    # Not indexed: only deleting a provider (rare, PROTECTed) searches by it; every claim
    # would pay for the index.
    provider = models.ForeignKey(
        Provider,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="operations",
        db_index=False,
        db_constraint=False,
    )
    action = models.CharField(max_length=100, blank=True)
    # sha256 of the request (services.request_fingerprint): 32 bytes stored, hex everywhere else.
    fingerprint = HexBytesField(hex_length=64)
    # execute mode only: the provider-neutral request the workers send.
    request = SealedJSONField(null=True, blank=True)
    payload = SealedJSONField(null=True, blank=True)
    # Plain text of the configured non-personal paths only (OPERATION_SEARCH_PATHS), for
    # filtering without decrypting; never a personal identifier (DESIGN §6).
    search_fields = models.JSONField(null=True, blank=True)
    attempts = Counter(default=0)
    # 429/503 answers: counted in `attempts` but not against max_attempts.
    throttled_attempts = Counter(default=0)
    max_attempts = Counter(default=4)
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The latest attempt's token (services.new_lease_token: 16 random bytes, 32 hex digits).
    # Never cleared: fencing compares against it.
    lease_token = HexBytesField(hex_length=32, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    uses_sent_marker = models.BooleanField(default=False)
    # A guard-mode claim's first move ('' → claimed) kept on the row instead of an event row of
    # its own (ADR 0024): who claimed (the event's actor) and whether the claim was also the
    # sent marker (reason "claimed, sent"); its time is created_at, its attempt 1. Written by
    # the insert, never updated. NULL: the first move is an event row (execute mode, and every
    # row claimed before ADR 0024). Readers list an operation's moves with
    # ledger.protocol.selectors.operation_history, which puts this one first.
    claim_actor = models.CharField(max_length=150, null=True, blank=True)
    # (Nullable with no default, as claim_actor: adding it rewrites no table, SQLite's included.)
    claim_sent = models.BooleanField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    error_class = models.CharField(max_length=16, blank=True, choices=ErrorClass.choices)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = Counter(null=True, blank=True)
    response_body = SealedJSONField(null=True, blank=True)
    reconciliation_handle = models.CharField(max_length=255, blank=True)
    execution_id = models.CharField(max_length=255, blank=True)
    workflow_id = models.CharField(max_length=255, blank=True)
    workflow_version = models.CharField(max_length=100, blank=True)
    correlation_id = models.CharField(max_length=255, blank=True)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Runs (DESIGN §3, runs): operations that share a run are the ordered steps of one
    # business transaction. `run` is the explicit run id sent with the claim or submission;
    # empty, the correlation id is the run (ledger.protocol.selectors.run_operations says so once).
    run = models.CharField(max_length=255, blank=True, default="", db_default="")
    step = Counter(null=True, blank=True)
    # Versioned keys: sent as parts, the key is "{record}:{action}:v{version}" and the parts
    # are kept (not workflow_version). A newer version of the same record and action sets
    # `replaced_by` on the older ones (not superseded_by, which links DLQ replays).
    record = models.CharField(max_length=200, blank=True, default="", db_default="")
    version = Counter(null=True, blank=True)
    replaced_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    # Execute mode: the adapter revision this operation's next attempt runs under (assigned at
    # submission — the stable revision or, for its share of new keys, a canary — and moved
    # only while nothing is under way: ledger.providers.revisions / ledger.providers.canary). Each attempt keeps
    # its own. Not indexed: a rollback reads the open rows through OpenOperation (ADR 0017).
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # When the tenant's eligibility webhook last answered "still wanted" for this row.
    eligibility_confirmed_at = models.DateTimeField(null=True, blank=True)
    # Execute mode: size of the stored request plus the bytes of the uploads its intent
    # references (admission's queued-bytes limit: DESIGN §11), the
    # provider's unit price at submission (the tenant's budget; refunded by failed/abandoned)
    # and where the terminal outcome is POSTed.
    request_bytes = Counter(default=0, db_default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=4, default=0, db_default=0)
    callback_url = models.CharField(max_length=1000, blank=True, default="", db_default="")
    # The W3C traceparent of the claim's span, stored only when tracing is on and the caller sent
    # one: the worker's attempt, polls and the callback continue that trace later (ADR 0015).
    trace_context = models.CharField(max_length=55, blank=True, default="", db_default="")
    # Asynchronous providers: polls of the current job so far (the backoff's exponent). A
    # claimed row with polls > 0 holds a poll lease, not a send's (the sweeper returns it to
    # waiting when it expires); a take for a send sets it back to 0.
    polls = Counter(default=0, db_default=0)
    # Sweeper bookkeeping.
    reconcile_until = models.DateTimeField(null=True, blank=True)
    lookup_failures = Counter(default=0)
    alerted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ledger_operation"
        # The console's operator actions (ledger.protocol.transitions: operation_cancel / operation_retry_now).
        permissions = [("cancel_operation", "Can cancel operations and retry them now")]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="operation_unique_key_per_tenant"),
            # A terminal state always has its finishing time, and only a terminal one does.
            models.CheckConstraint(
                condition=(Q(status__in=sorted(TERMINAL_STATES)) & Q(done_at__isnull=False))
                | (~Q(status__in=sorted(TERMINAL_STATES)) & Q(done_at__isnull=True)),
                name="operation_done_at_iff_terminal",
            ),
            models.CheckConstraint(condition=Q(status__in=list(S.values)), name="operation_status_valid"),
            models.CheckConstraint(
                condition=~Q(status=S.CLAIMED) | Q(lease_expires_at__isnull=False),
                name="operation_claimed_has_lease",
            ),
            # Waiting on a provider: its job id is known, no lease is held, the next poll is set.
            models.CheckConstraint(
                condition=~Q(status=S.WAITING)
                | (~Q(provider_ref="") & Q(lease_expires_at__isnull=True) & Q(next_attempt_at__isnull=False)),
                name="operation_waiting_has_job",
            ),
        ]
        # Each index's query, how often it is read, its entries per claim→complete and whether
        # the completion changes a column it names: docs/adr/0011-operation-index-audit.md
        # (with the GIN index of migration 0004, 23 with the keys; ADR 0018 moved the search
        # trigram index of migration 0028 and op_ref_idx to OperationSearch, ADR 0023 dropped
        # op_handle_idx: 12 with the keys and the GIN index, each named with its query in ADR 0023).
        indexes = [
            # The work queue's indexes — open rows by state, lease, due time and last move, and
            # the public `updated_after` filter's (tenant, updated_at, id) — live on
            # OpenOperation and the terminal events (ADR 0017): no index here names a column a
            # completion changes, so the completion is a HOT update.
            # Lists newest first, by tenant and optionally state (migration 0017 says why): read
            # straight off the index whatever the tenant or the filter. `status=succeeded` lists
            # read it and keep the 98 % that match (ADR 0017).
            models.Index(fields=["tenant", "id"], name="op_tenant_id_idx"),
            # Admission's budget: what a tenant submitted in execute mode in the current period.
            # Partial (migration 0021): guard-mode claims, most of the ledger, write nothing here.
            models.Index(fields=["tenant", "created_at"], name="op_exec_created_idx", condition=Q(mode="execute")),
            # The API's execution_id filter, the API's correlation_id filter and a run's steps
            # without a run id (selectors.run_operations, a BitmapOr with op_run_idx): partial, so
            # the many rows without one cost no index write. The reconciliation handle, the
            # provider reference and the console's search text are not indexed here: they live
            # in OperationSearch, written once (ADRs 0018, 0023); the API's reconciliation_handle
            # filter reads the search rows' trigram index (selectors.operations_with_handle).
            models.Index(fields=["execution_id"], name="op_execution_idx", condition=~Q(execution_id="")),
            models.Index(fields=["correlation_id"], name="op_correlation_idx", condition=~Q(correlation_id="")),
            # A search by workflow name ends here: the ids of the workflows so named (WorkflowName).
            models.Index(fields=["tenant", "workflow_id"], name="op_workflow_idx", condition=~Q(workflow_id="")),
            # Deleting an operation (retention) finds the rows that point at it.
            models.Index(fields=["superseded_by"], name="op_superseded_idx", condition=Q(superseded_by__isnull=False)),
            models.Index(fields=["replaced_by"], name="op_replaced_idx", condition=Q(replaced_by__isnull=False)),
            # A run's steps, and the versions of one record and action: partial, so claims
            # without a run or a versioned key write nothing here.
            models.Index(fields=["tenant", "run", "step"], name="op_run_idx", condition=~Q(run="")),
            models.Index(
                fields=["tenant", "record", "action", "version"], name="op_record_idx", condition=~Q(record="")
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATES


class OpenOperation(models.Model):
    """The work queue (ADR 0017): one row per operation in an open state, mirroring the few
    columns the workers, the sweeper and the open-row lists select by. Written only by the
    database, in the statement that writes the operation row (triggers of migration 0042):
    inserted with an open row, updated by a move between open states, a heartbeat or a new due
    time, deleted by the terminal move — never updated to a terminal state. So its indexes hold
    the work under way and a completion adds no index entry anywhere; the operation row's
    `status`, `lease_expires_at`, `next_attempt_at` and `updated_at` stay the record, which the
    detail pages and exports read, and no index of `ledger_operation` names them."""

    # The operation's id; no foreign key (its check would lock the operation row at every
    # claim): the triggers write both rows in one statement, and delete this one with it.
    operation = models.OneToOneField(
        Operation,
        primary_key=True,
        db_column="id",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="open_row",
    )
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    status = models.CharField(max_length=16, choices=OperationStatus.choices)
    mode = models.CharField(max_length=8, choices=OperationMode.choices)
    provider = models.ForeignKey(
        Provider, on_delete=models.DO_NOTHING, db_constraint=False, null=True, db_index=False, related_name="+"
    )
    lease_expires_at = models.DateTimeField(null=True)
    next_attempt_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "ledger_open_operation"
        constraints = [
            # Only open states have a row here (the terminal move deletes it).
            models.CheckConstraint(condition=~Q(status__in=sorted(TERMINAL_STATES)), name="open_operation_status_open"),
        ]
        # Each was on ledger_operation with the same key and predicate (ADR 0011 rows 6–8,
        # 10–15); on this table every row is open, so "not terminal" needs no predicate.
        indexes = [
            # Lists filtered by an open state, newest first (the open part of the former
            # op_tenant_other_status_idx).
            models.Index(fields=["tenant", "status", "operation"], name="open_tenant_status_idx"),
            # The sweeper's expired leases.
            models.Index(
                fields=["status", "lease_expires_at"], name="open_claimed_lease_idx", condition=Q(status="claimed")
            ),
            # Console needs=stuck and needs=cancellable, the stuck count and the dashboard's stuck
            # rows, in list order with the time of the last move on the entry.
            models.Index(fields=["operation", "updated_at"], name="open_id_updated_idx"),
            # Guard-mode retries past their lifetime, the console's "due" filter.
            models.Index(
                fields=["status", "next_attempt_at"],
                name="open_due_idx",
                condition=Q(status__in=["queued", "retry_wait"]),
            ),
            # The rows an operator can cancel, in list order.
            models.Index(
                fields=["operation"], name="open_cancellable_id_idx", condition=Q(status__in=["queued", "retry_wait"])
            ),
            # The sweeper's reconciliation of uncertain rows, review and stuck counts.
            models.Index(
                fields=["status", "updated_at"],
                name="open_unresolved_idx",
                condition=Q(status__in=["uncertain", "review"]),
            ),
            # A capped provider's calls in flight, counted at every take.
            models.Index(
                fields=["provider"], name="open_exec_inflight_idx", condition=Q(status="claimed", mode="execute")
            ),
            # Workers take due execute-mode rows oldest first (FOR UPDATE SKIP LOCKED of the
            # operation row: ledger.execution.attempts).
            models.Index(
                fields=["next_attempt_at", "operation"],
                name="open_exec_due_idx",
                condition=Q(status__in=["queued", "retry_wait"], mode="execute"),
            ),
            # The fair take (ADR 0021): due execute-mode rows by tenant and state, oldest first, so
            # the take walks the tenants with queued work (a skip scan: one descent per tenant)
            # and reads each one's oldest first attempts and retries (ledger.execution.fairness).
            models.Index(
                fields=["tenant", "status", "next_attempt_at", "operation"],
                name="open_exec_tenant_due_idx",
                condition=Q(status__in=["queued", "retry_wait"], mode="execute"),
            ),
            # Workers take due polls of rows waiting on a provider.
            models.Index(
                fields=["next_attempt_at", "operation"], name="open_waiting_due_idx", condition=Q(status="waiting")
            ),
            # The public `updated_after` filter's open rows (its terminal rows: the terminal
            # events' opevent_terminal_at_idx, migration 0042).
            models.Index(fields=["tenant", "updated_at", "operation"], name="open_tenant_updated_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.status}"


class Attempt(models.Model):
    """One row per try. A fenced holder's late result is kept here, never on the operation."""

    # The table is partitioned by month of started_at (migration 0025), and a partitioned
    # table's primary key must hold its partition key. The id alone still names one row: it
    # comes from the table's one sequence (NewRowId).
    pk = models.CompositePrimaryKey("id", "started_at")
    id = models.BigIntegerField(db_default=NewRowId("ledger_attempt"))
    # The operation's tenant, copied when the row is written: Citus distributes every
    # tenant-owned table by tenant_id, co-located, and routes a statement to one node only
    # when it names the tenant, so every statement on this table does (DESIGN §12; migration
    # 0029). No foreign key of its own: on a partitioned table one cannot be added without a
    # scan of every row under a lock that stops writes (NOT VALID is refused there), and the
    # operation's key already ties the row to a tenant; on Citus it becomes
    # (tenant_id, operation_id) → (tenant_id, id). No index: every read names the operation.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    # Indexed by (operation, number). No database constraint (ADR 0023): its check locked the
    # operation row (FOR KEY SHARE, a Heap/LOCK record) at every claim; the ORM's CASCADE and
    # retention delete attempts with their operation, and ledger_orphans reports any left.
    operation = models.ForeignKey(
        Operation, on_delete=models.CASCADE, related_name="attempt_set", db_index=False, db_constraint=False
    )
    number = Counter()
    lease_token = HexBytesField(hex_length=32)
    started_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.PENDING)
    error_class = models.CharField(max_length=16, blank=True)
    message = models.CharField(max_length=500, blank=True)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = Counter(null=True, blank=True)
    response_body = SealedJSONField(null=True, blank=True)
    execution_id = models.CharField(max_length=255, blank=True)
    duration_ms = Counter(null=True, blank=True)
    # The adapter revision this attempt ran under (execute mode; copied from its operation
    # when the attempt opens). Guard-mode attempts have none.
    adapter_revision = models.ForeignKey(
        AdapterRevision, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )
    # The prompt template version the attempt's request was rendered with (intent envelopes
    # whose request template names a prompt: ledger.providers.prompts); set by the worker before it sends.
    prompt_template = models.ForeignKey(
        PromptTemplate, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_index=False
    )

    class Meta:
        db_table = "ledger_attempt"
        # Not unique: a partitioned table enforces uniqueness within a partition only, and the
        # number does not hold the partition's time (migration 0025). An attempt's number is its
        # operation's `attempts` counter, moved by the guarded UPDATE that opens it under the
        # operation's row lock, so two attempts of one operation never share one.
        indexes = [
            models.Index(fields=["operation", "number"], name="attempt_op_number_idx"),
            # The canary watch: a revision's attempts started within its window. Partial, so
            # guard-mode attempts (no revision) write nothing here. On started_at, which never
            # changes, not finished_at: a column in any index (its predicate included) makes
            # every update that changes it a non-HOT one, and finishing an attempt sets
            # finished_at (migration 0021).
            models.Index(
                fields=["adapter_revision", "started_at"],
                name="attempt_revision_start_idx",
                condition=Q(adapter_revision__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.number}"


class OperationEvent(models.Model):
    """Append-only history: every transition, its actor and its reason."""

    # Partitioned by month of `at` (migration 0025); see Attempt.pk.
    pk = models.CompositePrimaryKey("id", "at")
    id = models.BigIntegerField(db_default=NewRowId("ledger_operationevent"))
    # The operation's tenant, copied when the row is written: Citus distributes every
    # tenant-owned table by tenant_id, co-located, and routes a statement to one node only
    # when it names the tenant, so every statement on this table does (DESIGN §12; migration
    # 0029). No foreign key of its own: on a partitioned table one cannot be added without a
    # scan of every row under a lock that stops writes (NOT VALID is refused there), and the
    # operation's key already ties the row to a tenant; on Citus it becomes
    # (tenant_id, operation_id) → (tenant_id, id). No index: every read names the operation.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    # Indexed by operation alone (a history is a few rows, sorted after reading). No database
    # constraint (ADR 0023): its check locked the operation row at every move's event (the
    # completion's included); see Attempt.operation.
    operation = models.ForeignKey(
        Operation, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500, blank=True)
    attempt = Counter(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        db_table = "ledger_operationevent"
        indexes = [
            # One column, so PostgreSQL stores an operation's events as one deduplicated entry
            # (migration 0021; (operation, at) could not deduplicate).
            models.Index(fields=["operation"], name="opevent_op_idx"),
            # Review decisions by time (migration 0022), for the dashboard's activity chart:
            # partial, so only the rare event that moves a row out of review writes here.
            models.Index(
                fields=["at"],
                name="opevent_review_exit_idx",
                condition=Q(from_status="review") & ~Q(to_status="review"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.from_status or '∅'} → {self.to_status}"


class OperationSearch(models.Model):
    """What the console's search box and the API's ``provider_ref`` filter find an operation by,
    written once (ADR 0018): the claim's row (``seq`` 0) holds its key, reconciliation handle,
    execution and correlation ids joined by chr(1) (``SEARCH_SEPARATOR``);
    an identifier that becomes known later (a provider reference at completion or when the
    provider accepts the job, a handle at the sent marker, an execution id at a reclaim) is a
    row appended after it, never an UPDATE. Nothing on the hot row is indexed for search, so a
    completion writes no trigram entry and changes no column a search index names.

    Deleted with its operation (retention's ``_delete_operation_rows`` and the ORM collector
    follow the CASCADE); erasure cuts the person's values out of ``text`` as out of every other
    text of the record. No database constraint to the operation: the insert would lock the
    operation row it names (ADR 0019); ``ledger_orphans`` reports rows left without one."""

    # (operation, seq): deletes by operation, the next seq of an append, and the superuser's
    # newest-first walk all read this one B-tree.
    pk = models.CompositePrimaryKey("operation_id", "seq")
    operation = models.ForeignKey(
        Operation, on_delete=models.CASCADE, related_name="search_rows", db_index=False, db_constraint=False
    )
    # 0 for the claim's row; each append takes the next (under the operation's row lock).
    seq = models.PositiveSmallIntegerField()
    # The operation's tenant, copied (Citus routes by it; a scoped search binds it).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    # True: ``text`` is a provider reference, found exactly or by prefix (never in the middle).
    # False: identifiers, found by any part of one (trigram GIN on PostgreSQL, migration 0043).
    ref = models.BooleanField(default=False)
    text = models.TextField()

    class Meta:
        db_table = "ledger_operation_search"
        indexes = [
            # A tenant's matches newest first: a tenant's search walks its own rows backwards
            # until its page is full, or narrows the trigram bitmap to them (a small tenant's
            # common text, ADR 0018).
            models.Index(fields=["tenant", "operation"], name="opsearch_tenant_op_idx"),
            # Provider references by exact value or prefix (pattern ops on PostgreSQL; ignored
            # elsewhere), whatever the database's collation: the console's prefix search, the
            # API's provider_ref filter.
            models.Index(
                fields=["text"], name="opsearch_ref_idx", condition=Q(ref=True), opclasses=["text_pattern_ops"]
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}#{self.seq}"

    @staticmethod
    def joined(*identifiers: str) -> str:
        """The claim's row text: its identifiers joined by chr(1), which no identifier holds, so
        a substring match never spans two of them."""
        return SEARCH_SEPARATOR.join(identifiers)


# Between the identifiers of an OperationSearch row's text.
SEARCH_SEPARATOR = "\x01"


class AdmissionRefusalCount(models.Model):
    """Refused admissions by tenant and reason, for metrics. Refusals store nothing about
    the request itself; this counter is all that remains of them."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    reason = models.CharField(max_length=64)
    count = models.PositiveBigIntegerField(default=0)
    last_at = models.DateTimeField()

    class Meta:
        db_table = "ledger_admissionrefusalcount"
        constraints = [models.UniqueConstraint(fields=["tenant", "reason"], name="admission_refusal_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.reason}={self.count}"


class Tombstone(models.Model):
    """What is left of an operation retention deleted: enough to keep answering its key.

    ``operation_claim`` never re-creates a key that has a tombstone (a NOT EXISTS guard
    inside its INSERT) and answers from this row instead (``ledger.protocol.tombstones``). Written
    and expired by the retention purge (``review.retention``).
    """

    # Indexed by the unique (tenant, key): a tenant-only index let a claim's tombstone check
    # (planned once, on an empty table) walk every tombstone of the tenant.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=255)
    operation_id = models.BigIntegerField()
    mode = models.CharField(max_length=8)
    action = models.CharField(max_length=100, blank=True)
    provider_slug = models.CharField(max_length=63, blank=True)
    fingerprint = HexBytesField(hex_length=64)
    final_status = models.CharField(max_length=16)
    provider_ref = models.CharField(max_length=255, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    done_at = models.DateTimeField()
    deleted_at = models.DateTimeField()
    keep_until = models.DateTimeField()

    class Meta:
        db_table = "ledger_tombstone"
        constraints = [models.UniqueConstraint(fields=["tenant", "key"], name="tombstone_unique_key")]
        indexes = [models.Index(fields=["keep_until"], name="tombstone_keep_idx")]

    def __str__(self) -> str:
        return f"†{self.key}"
