-- The ledger's hot statements: one per transition, read top to bottom.
--
-- Each block starts with `-- name: <statement> --` and is loaded once per process by
-- ledger/store/statements.py. Parameters are named; every value is a parameter, so the text never
-- changes and PostgreSQL prepares each statement after a few uses. The same text serves
-- PostgreSQL and SQLite; the loader rewrites three spellings for the database in use:
--   now()                      the database's clock (SQLite: strftime(..., 'now'), the clock of
--                              this process, which is where the embedded database runs)
--   ledger_now_plus(<param>)   now() plus a number of seconds; NULL for NULL
--   ledger_seconds_since(<col>) seconds from a timestamp column to now(), as a double
--   LEAST(…), GREATEST(…)      SQLite: its scalar MIN(…), MAX(…)
--   {claimed}, {queued}, …     a declared OperationStatus (or {attempt_…} AttemptOutcome) value
--                              as a checked SQL literal: a partial index on a state can only
--                              serve a statement whose state the planner sees
-- Every statement names the tenant it reads or writes (`tenant_id = %(tenant_id)s`, or the new
-- row's tenant_id), a value the caller holds, never NULL: Citus routes a statement to one node
-- by it (DESIGN §12; tests/test_citus_readiness.py checks every statement).
-- Every guard sits in the WHERE clause: a statement that matches no row means someone else
-- moved the row first, and the service raises a named error; nothing is ever overwritten.
-- The event row of a move is written by `event_insert` in the same transaction (services).
--
-- The two moves every operation makes, claim and complete, also have a PostgreSQL form
-- (`…_pg`): the same row move, its attempt row and its event row as one statement
-- (data-modifying CTEs), so each costs one round trip instead of three to five. The
-- portable statements stay the definition (SQLite runs them, and tests/ledger/
-- test_statements.py holds that both forms leave identical rows and answers).


-- name: operation_insert --
-- A new key becomes one operation: claimed (guard mode, with its lease) or queued (execute
-- mode). A guard claim's move ('' → claimed) is kept on the row — %(claim_actor)s, the claim's
-- actor, and %(claim_sent)s, whether it was the sent marker too — and writes no event row; a
-- queued row's move is an event row (ADR 0024). Nothing is inserted when the key is taken (the caller then answers for the existing
-- row) or when retention deleted its operation and left a tombstone, which keeps answering
-- late retries: a deleted key is never executed again.
INSERT INTO ledger_operation (
    tenant_id, key, mode, status, provider_id, action, fingerprint,
    request, payload, search_fields,
    attempts, throttled_attempts, max_attempts,
    claimed_at, lease_expires_at, lease_token, sent_at, uses_sent_marker,
    next_attempt_at, deadline, expires_at,
    last_error, error_class, provider_ref, response_status, response_body,
    reconciliation_handle, execution_id, workflow_id, workflow_version, correlation_id,
    run, step, record, version,
    lookup_failures, request_bytes, cost, callback_url, adapter_revision_id, trace_context,
    claim_actor, claim_sent,
    created_at, updated_at
)
SELECT
    %(tenant_id)s, CAST(%(key)s AS varchar), %(mode)s, %(status)s, %(provider_id)s, %(action)s, %(fingerprint)s,
    %(request)s, %(payload)s, %(search_fields)s,
    %(attempts)s, 0, %(max_attempts)s,
    CASE WHEN %(claimed)s THEN now() END,
    ledger_now_plus(%(lease_seconds)s),
    %(lease_token)s,
    CASE WHEN %(mark_sent)s THEN now() END,
    %(uses_sent_marker)s,
    CASE WHEN %(queued)s THEN now() END,
    ledger_now_plus(%(deadline_seconds)s),
    ledger_now_plus(%(lifetime_seconds)s),
    '', '', '', NULL, NULL,
    %(reconciliation_handle)s, %(execution_id)s, %(workflow_id)s, %(workflow_version)s, %(correlation_id)s,
    %(run)s, %(step)s, %(record)s, %(version)s,
    0, %(request_bytes)s, %(cost)s, %(callback_url)s, %(adapter_revision_id)s, %(trace_context)s,
    %(claim_actor)s, %(claim_sent)s,
    now(), now()
-- (The key is written twice as CAST(… AS varchar): a parameter used in two places must be
-- of one type on PostgreSQL.)
WHERE NOT EXISTS (SELECT 1 FROM ledger_tombstone WHERE tenant_id = %(tenant_id)s AND key = CAST(%(key)s AS varchar))
ON CONFLICT (tenant_id, key) DO NOTHING
RETURNING *;


-- name: operation_claim_pg --
-- PostgreSQL: operation_insert, then attempt_open (when the claim opened an attempt) and the
-- claim's event_insert (a queued row's only: ADR 0024), in one statement. The attempt and the event read the new row from
-- the INSERT's RETURNING (a statement does not see its own writes in the table); nothing
-- is written at all when the key is taken or tombstoned. Every clause of the INSERT is
-- operation_insert's.
WITH op AS (
    INSERT INTO ledger_operation (
        tenant_id, key, mode, status, provider_id, action, fingerprint,
        request, payload, search_fields,
        attempts, throttled_attempts, max_attempts,
        claimed_at, lease_expires_at, lease_token, sent_at, uses_sent_marker,
        next_attempt_at, deadline, expires_at,
        last_error, error_class, provider_ref, response_status, response_body,
        reconciliation_handle, execution_id, workflow_id, workflow_version, correlation_id,
        run, step, record, version,
        lookup_failures, request_bytes, cost, callback_url, adapter_revision_id, trace_context,
        claim_actor, claim_sent,
        created_at, updated_at
    )
    SELECT
        %(tenant_id)s, CAST(%(key)s AS varchar), %(mode)s, %(status)s, %(provider_id)s, %(action)s, %(fingerprint)s,
        %(request)s, %(payload)s, %(search_fields)s,
        %(attempts)s, 0, %(max_attempts)s,
        CASE WHEN %(claimed)s THEN now() END,
        ledger_now_plus(%(lease_seconds)s),
        %(lease_token)s,
        CASE WHEN %(mark_sent)s THEN now() END,
        %(uses_sent_marker)s,
        CASE WHEN %(queued)s THEN now() END,
        ledger_now_plus(%(deadline_seconds)s),
        ledger_now_plus(%(lifetime_seconds)s),
        '', '', '', NULL, NULL,
        %(reconciliation_handle)s, %(execution_id)s, %(workflow_id)s, %(workflow_version)s, %(correlation_id)s,
        %(run)s, %(step)s, %(record)s, %(version)s,
        0, %(request_bytes)s, %(cost)s, %(callback_url)s, %(adapter_revision_id)s, %(trace_context)s,
        %(claim_actor)s, %(claim_sent)s,
        now(), now()
    WHERE NOT EXISTS (SELECT 1 FROM ledger_tombstone WHERE tenant_id = %(tenant_id)s AND key = CAST(%(key)s AS varchar))
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING *
), attempt AS (
    -- attempt_open's row.
    INSERT INTO ledger_attempt (
        tenant_id, operation_id, number, lease_token, started_at, lease_expires_at, sent_at,
        outcome, error_class, message, provider_ref, execution_id, adapter_revision_id
    )
    SELECT %(tenant_id)s, id, attempts, lease_token, claimed_at, lease_expires_at, sent_at,
           {attempt_pending}, '', '', '', execution_id, adapter_revision_id
    FROM op WHERE attempts > 0
), event AS (
    -- event_insert's row: from no state to the new one — for a queued (execute-mode) row only.
    -- A guard claim's move is on the row itself (claim_actor, claim_sent, created_at: ADR 0024).
    INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason, attempt, at)
    SELECT %(tenant_id)s, id, '', status, %(actor)s, %(reason)s, attempts, now() FROM op
    WHERE claim_actor IS NULL
), search AS (
    -- operation_search_append's first row (seq 0): the identifiers the claim brings, joined as
    -- %(search_text)s (ADR 0018). Written once; nothing on the operation row is indexed for search.
    INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
    SELECT id, 0, %(tenant_id)s, FALSE, %(search_text)s FROM op
)
SELECT * FROM op;


-- name: operation_by_key --
-- The row that holds a key (the unique (tenant, key) index).
SELECT * FROM ledger_operation WHERE tenant_id = %(tenant_id)s AND key = %(key)s;


-- name: operation_reclaim --
-- retry_wait → claimed: a due retry of a guard-mode key, taken by the caller that claims the
-- key again. A new lease token fences out every earlier holder; the lifetime still counts.
UPDATE ledger_operation SET
    status = {claimed},
    attempts = attempts + 1,
    lease_token = %(lease_token)s,
    claimed_at = now(),
    lease_expires_at = ledger_now_plus(%(lease_seconds)s),
    sent_at = CASE WHEN %(mark_sent)s THEN now() END,
    uses_sent_marker = (uses_sent_marker OR %(mark_sent)s),
    next_attempt_at = NULL,
    execution_id = COALESCE(NULLIF(%(execution_id)s, ''), execution_id),
    updated_at = now()
WHERE id = %(id)s AND tenant_id = %(tenant_id)s AND status = {retry_wait}
  AND next_attempt_at <= now()
  AND (expires_at IS NULL OR expires_at > now())
RETURNING *;


-- name: operations_in_flight_by_tenant --
-- Execute-mode rows being sent now (claimed: sends and polls), per tenant: what the fair take's
-- caps count (ADR 0021), read under its lock. The claimed rows are the work under way, a short
-- range of the work queue's open_exec_inflight_idx (ADR 0017). Across tenants by design: the
-- take serves every tenant.
SELECT tenant_id, COUNT(*) FROM ledger_open_operation
WHERE status = {claimed} AND mode = 'execute'
GROUP BY tenant_id;


-- name: operations_take_fair_pg --
-- The workers' fair pick (ADR 0021), PostgreSQL; the SQLite equivalent is
-- ledger.execution.fairness.fair_order over the same per-tenant reads. Ids to take, in order:
--   walk    every tenant with queued or retry_wait execute-mode rows, by a skip scan of the
--           work queue's open_exec_tenant_due_idx (ADR 0017; one index descent per tenant,
--           never its rows);
--   turns   those with room under their in-flight cap (%(room_tenants)s/%(room)s: tenants with
--           a cap or rows in flight; the others get %(default_room)s), numbered from the one
--           after %(after)s (the last tenant the previous take served: a rotating start), each
--           with its share of rows per round;
--   picked  per tenant and state, its oldest due rows — first attempts and retries read apart,
--           so neither waits behind the other — of providers not held back (%(held_back)s:
--           paused, throttled or at their caps) and, for a retry, not waiting for its
--           eligibility recheck; read off the work queue, the operation row locked here (SKIP
--           LOCKED), so two takers share the queue;
--   ranked  a tenant's rows alternating between the two states, oldest first at each step.
-- Then round by round (a tenant's share of rows per round), tenants in turn order, cut at
-- %(limit)s. "Due" is on the statement's clock, as in the take's ORM read that follows
-- (Django's Now()), not the transaction's. A tenant's reads are an even split of the take
-- (times its share), so rows read past the cut — locked until the take commits — stay few.
-- Across tenants by design: the take serves every tenant.
WITH RECURSIVE walk(tenant_id) AS (
    (SELECT tenant_id FROM ledger_open_operation
     WHERE status IN ({queued}, {retry_wait}) AND mode = 'execute'
     ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT m.tenant_id FROM ledger_open_operation m
            WHERE m.status IN ({queued}, {retry_wait}) AND m.mode = 'execute' AND m.tenant_id > w.tenant_id
            ORDER BY m.tenant_id LIMIT 1)
    FROM walk w WHERE w.tenant_id IS NOT NULL
),
turns AS (
    SELECT w.tenant_id,
           LEAST(COALESCE(t.take_share, %(default_share)s), %(max_share)s) AS share,
           COALESCE(r.room, %(default_room)s) AS room,
           ROW_NUMBER() OVER (ORDER BY w.tenant_id <= %(after)s, w.tenant_id) AS turn,
           COUNT(*) OVER () AS tenants
    FROM walk w
    JOIN ledger_tenant t ON t.id = w.tenant_id
    LEFT JOIN unnest(CAST(%(room_tenants)s AS bigint[]), CAST(%(room)s AS integer[])) AS r(tenant_id, room)
        ON r.tenant_id = w.tenant_id
    WHERE w.tenant_id IS NOT NULL AND COALESCE(r.room, %(default_room)s) > 0
),
picked AS (
    SELECT c.id, u.tenant_id, u.turn, u.share, c.next_attempt_at,
           ROW_NUMBER() OVER (PARTITION BY u.tenant_id, s.status ORDER BY c.next_attempt_at, c.id) AS nth
    FROM turns u
    CROSS JOIN (VALUES ({queued}), ({retry_wait})) AS s(status)
    CROSS JOIN LATERAL (
        SELECT o.id, m.next_attempt_at FROM ledger_open_operation m
        JOIN ledger_operation o ON o.id = m.id AND o.tenant_id = m.tenant_id
        WHERE m.tenant_id = u.tenant_id AND m.status = s.status
          AND m.status IN ({queued}, {retry_wait}) AND m.mode = 'execute'
          AND m.next_attempt_at <= statement_timestamp()
          AND m.provider_id <> ALL(CAST(%(held_back)s AS bigint[]))
          -- The row's own state and due time: what FOR UPDATE checks again after waiting for
          -- a concurrent move (the mirror is not locked; ADR 0017).
          AND o.status = s.status AND o.next_attempt_at <= statement_timestamp()
          AND NOT (o.status = {retry_wait} AND EXISTS (
              SELECT 1 FROM ledger_provider p
              WHERE p.id = o.provider_id AND p.recheck_after IS NOT NULL
                AND COALESCE(o.eligibility_confirmed_at, o.created_at)
                    <= statement_timestamp() - p.recheck_after * interval '1 second'))
        ORDER BY m.next_attempt_at, m.id
        LIMIT LEAST(u.room, CEIL(CAST(%(limit)s AS numeric) / u.tenants) * u.share)
        FOR UPDATE OF o SKIP LOCKED
    ) AS c
    -- Only the first %(limit)s tenants in turn can be served by this take (each takes at least one
    -- row a round): the others' rows are not read nor locked; the rotation reaches them next.
    WHERE u.turn <= %(limit)s
),
ranked AS (
    SELECT id, tenant_id, turn, share,
           ROW_NUMBER() OVER (PARTITION BY tenant_id ORDER BY nth, next_attempt_at, id) AS place
    FROM picked
)
SELECT id, tenant_id FROM ranked
WHERE place <= (SELECT room FROM turns WHERE turns.tenant_id = ranked.tenant_id)
ORDER BY (place - 1) / share, turn, place
LIMIT %(limit)s;


-- name: operation_take --
-- queued|retry_wait → claimed by an execute-mode worker (the row was selected and locked by
-- the take's SKIP LOCKED read in the same transaction). The sent marker is written with the
-- take, since the worker sends right after; a row past its deadline or lifetime is taken
-- without it, to be failed instead of sent.
UPDATE ledger_operation SET
    status = {claimed},
    attempts = attempts + 1,
    lease_token = %(lease_token)s,
    claimed_at = now(),
    lease_expires_at = ledger_now_plus(%(lease_seconds)s),
    sent_at = CASE WHEN %(past_deadline)s THEN NULL ELSE now() END,
    uses_sent_marker = TRUE,
    next_attempt_at = NULL,
    polls = 0,
    updated_at = now()
WHERE id = %(id)s AND tenant_id = %(tenant_id)s AND status = %(from_status)s
RETURNING *;


-- name: operation_wait --
-- claimed → waiting (asynchronous providers): the holder hands the row to the provider. The
-- submit's answer named the job (its id becomes provider_ref), or a poll found it still
-- pending. No lease is held from here on; next_attempt_at is the next poll. Only the
-- current holder, and only while the row is still its own. The holder knows the row's tenant:
-- it routes the statement to one tenant (DESIGN §12, Citus).
UPDATE ledger_operation SET
    status = {waiting},
    provider_ref = %(provider_ref)s,
    lease_expires_at = NULL,
    next_attempt_at = ledger_now_plus(%(poll_in_seconds)s),
    updated_at = now()
WHERE id = %(id)s AND status = {claimed} AND lease_token = %(lease_token)s
  AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: operation_poll_take --
-- waiting → claimed for one poll, by a worker (the row was selected and locked by the take's
-- SKIP LOCKED read in the same transaction) or by the provider's webhook. A new token fences
-- out every earlier holder; the lease is a poll's, short. No new attempt: a poll sends
-- nothing that changes the provider's state, so the job stays the attempt that submitted it.
-- Both takers read the row's tenant with it (routed by one tenant: DESIGN §12, Citus).
UPDATE ledger_operation SET
    status = {claimed},
    lease_token = %(lease_token)s,
    claimed_at = now(),
    lease_expires_at = ledger_now_plus(%(lease_seconds)s),
    polls = polls + 1,
    next_attempt_at = NULL,
    updated_at = now()
WHERE id = %(id)s AND status = {waiting} AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: operation_mark_sent --
-- claimed → claimed with the sent marker: from now on a crash means "possibly sent". Only the
-- current holder, and only while its lease runs: a holder must not start an effect it may no
-- longer own. Leaves updated_at (the time of the last move between states, which lists and
-- retention read through indexes): a marker that changes no indexed column is a HOT update
-- (DESIGN §12, cheaper growth), unless it brings a new reconciliation handle.
UPDATE ledger_operation SET
    sent_at = COALESCE(sent_at, now()),
    reconciliation_handle = COALESCE(NULLIF(%(reconciliation_handle)s, ''), reconciliation_handle)
WHERE id = %(id)s AND status = {claimed} AND lease_token = %(lease_token)s
  AND lease_expires_at > now()
  AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: operation_heartbeat --
-- A live holder extends its lease. Not a transition: no event row.
UPDATE ledger_operation SET
    lease_expires_at = ledger_now_plus(%(lease_seconds)s),
    updated_at = now()
WHERE id = %(id)s AND status = {claimed} AND lease_token = %(lease_token)s
  AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: operation_complete --
-- claimed|uncertain|review → succeeded, by the latest attempt's token only: the latest
-- holder's result is the best evidence there is, also after the sweeper moved the row on.
-- Run once per source state (claimed first), so the event knows the state it left.
UPDATE ledger_operation SET
    status = {succeeded},
    provider_ref = %(provider_ref)s,
    response_status = %(response_status)s,
    response_body = %(response_body)s,
    lease_expires_at = NULL,
    error_class = '',
    done_at = now(),
    updated_at = now()
WHERE id = %(id)s AND status = %(from_status)s AND lease_token = %(lease_token)s
  AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: operation_complete_pg --
-- PostgreSQL: operation_complete from whichever of claimed, uncertain or review the row is
-- in, then attempt_succeed and the move's event_insert, in one statement. `fast` is the
-- common case (ADR 0023): one guarded UPDATE from claimed, with no lock taken before it (no
-- Heap/LOCK record). Its guard names the one state, and PostgreSQL re-checks a guarded
-- UPDATE's WHERE on the row version it finally moves (a concurrent move is waited for, then
-- the guard is evaluated again on the row as that move left it), so a row it moved was
-- claimed, exactly. Only when it moved nothing (the row was uncertain or review, or the
-- sweeper moved it first) does `locked` run (its NOT EXISTS is evaluated once, before its
-- scan): it locks the row and reads the state it leaves (FOR UPDATE waits for a concurrent
-- move and reads the row as that move left it, then the guard is checked again), and `slow`
-- moves the row `locked` locked. slow's WHERE must not compare the state again: it first
-- meets the row as the statement's snapshot saw it, before a move `locked` waited for (the
-- sweeper's claimed → uncertain), and a guard false there is never re-checked on the row as
-- it now is; the lock already guarantees the guard (slow moves the row by its id only when
-- `locked` holds it). `held` names the state the row left,
-- whichever path moved it, so the event names the state this statement moved the row from,
-- as the portable path's one-state-at-a-time updates do. (Its tenant, which never changes,
-- it names: Citus routes each CTE by it.)
WITH fast AS (
    UPDATE ledger_operation SET
        status = {succeeded},
        provider_ref = %(provider_ref)s,
        response_status = %(response_status)s,
        response_body = %(response_body)s,
        lease_expires_at = NULL,
        error_class = '',
        done_at = now(),
        updated_at = now()
    WHERE id = %(id)s AND status = {claimed} AND lease_token = %(lease_token)s
      AND tenant_id = %(tenant_id)s
    RETURNING ledger_operation.*
), locked AS (
    SELECT id, status AS from_status FROM ledger_operation
    WHERE id = %(id)s AND status IN ({claimed}, {uncertain}, {review}) AND lease_token = %(lease_token)s
      AND tenant_id = %(tenant_id)s AND NOT EXISTS (SELECT 1 FROM fast)
    FOR UPDATE
), slow AS (
    -- The same SET as `fast` (one statement cannot share it between two UPDATEs): change both.
    UPDATE ledger_operation SET
        status = {succeeded},
        provider_ref = %(provider_ref)s,
        response_status = %(response_status)s,
        response_body = %(response_body)s,
        lease_expires_at = NULL,
        error_class = '',
        done_at = now(),
        updated_at = now()
    WHERE id = %(id)s AND tenant_id = %(tenant_id)s AND EXISTS (SELECT 1 FROM locked)
    RETURNING ledger_operation.*
), op AS (
    -- At most one of them moved the row (slow runs only when fast moved nothing): LIMIT 1
    -- says so to the planner, which then reads the attempt's partition by the row's id and
    -- creation time (one month's index, as a one-row UPDATE's RETURNING lets it).
    SELECT * FROM fast UNION ALL SELECT * FROM slow LIMIT 1
), held AS (
    SELECT id, {claimed} AS from_status FROM fast UNION ALL SELECT id, from_status FROM locked
), attempt AS (
    -- attempt_succeed. The attempt started between its operation's creation and now: on the
    -- monthly partitions of ledger_attempt (DESIGN §12) that range prunes the update to the
    -- partitions it spans — one, for an operation created this month — instead of probing
    -- every month's index.
    UPDATE ledger_attempt SET
        outcome = {attempt_succeeded},
        finished_at = now(),
        provider_ref = %(provider_ref)s,
        response_status = %(response_status)s
    FROM op
    WHERE ledger_attempt.tenant_id = %(tenant_id)s
      AND ledger_attempt.operation_id = op.id AND ledger_attempt.number = op.attempts
      AND ledger_attempt.started_at >= op.created_at AND ledger_attempt.started_at <= now()
), event AS (
    -- event_insert: from the state `held` read to succeeded.
    INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason, attempt, at)
    SELECT %(tenant_id)s, op.id, held.from_status, op.status, %(actor)s, %(reason)s, op.attempts, now()
    FROM op JOIN held ON held.id = op.id
), search AS (
    -- operation_search_append of the provider reference the completion brings: a row appended
    -- after the operation's others (its row lock, taken by `held`, orders the appends), never
    -- an update (ADR 0018); none without a reference or for one it already has.
    INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
    SELECT op.id,
           COALESCE((SELECT MAX(s.seq) FROM ledger_operation_search s
                     WHERE s.operation_id = op.id AND s.tenant_id = %(tenant_id)s), -1) + 1,
           %(tenant_id)s, TRUE, op.provider_ref
    FROM op
    WHERE op.provider_ref <> ''
      AND NOT EXISTS (SELECT 1 FROM ledger_operation_search s
                      WHERE s.operation_id = op.id AND s.tenant_id = %(tenant_id)s AND s.ref AND s.text = op.provider_ref)
    ON CONFLICT DO NOTHING
)
SELECT * FROM op;


-- name: operation_search_append --
-- A searchable identifier of an operation, as a row of its own (ADR 0018): the claim's joined
-- identifiers (seq 0), or one that became known later — a provider reference (ref: found
-- exactly or by prefix), a reconciliation handle at the sent marker, an execution id at a
-- reclaim. Appended, never updated: the next seq after the operation's others (the caller holds
-- the operation's row lock, which orders appends), nothing for an empty text or one the
-- operation already has. ON CONFLICT: a search row must never fail the move it follows.
INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
SELECT %(operation_id)s,
       COALESCE((SELECT MAX(seq) FROM ledger_operation_search
                 WHERE operation_id = %(operation_id)s AND tenant_id = %(tenant_id)s), -1) + 1,
       %(tenant_id)s, %(ref)s, CAST(%(text)s AS text)
WHERE CAST(%(text)s AS text) <> ''
  AND NOT EXISTS (SELECT 1 FROM ledger_operation_search
                  WHERE operation_id = %(operation_id)s AND tenant_id = %(tenant_id)s
                    AND ref = %(ref)s AND text = CAST(%(text)s AS text))
ON CONFLICT DO NOTHING;


-- name: operation_fail --
-- The latest holder's failure, moved to the state the failure table chose (services decide
-- it under a row lock): retry_wait (with its due time), uncertain, review or failed.
UPDATE ledger_operation SET
    status = %(to_status)s,
    error_class = %(error_class)s,
    last_error = %(message)s,
    lease_expires_at = NULL,
    response_status = CASE WHEN %(keep_response)s THEN response_status ELSE %(response_status)s END,
    response_body = CASE WHEN %(keep_response)s THEN response_body ELSE %(response_body)s END,
    throttled_attempts = throttled_attempts + %(throttled)s,
    next_attempt_at = ledger_now_plus(%(retry_in_seconds)s),
    done_at = CASE WHEN %(terminal)s THEN now() ELSE done_at END,
    updated_at = now()
WHERE id = %(id)s AND status = %(from_status)s AND lease_token = %(lease_token)s
  AND tenant_id = %(tenant_id)s
RETURNING *;


-- name: attempt_open --
-- The attempt a claim, reclaim or take opened, numbered and leased as its operation, under
-- the adapter revision the operation runs under.
INSERT INTO ledger_attempt (
    tenant_id, operation_id, number, lease_token, started_at, lease_expires_at, sent_at,
    outcome, error_class, message, provider_ref, execution_id, adapter_revision_id
)
SELECT tenant_id, id, attempts, lease_token, claimed_at, lease_expires_at, sent_at,
       {attempt_pending}, '', '', '', execution_id, adapter_revision_id
FROM ledger_operation WHERE id = %(operation_id)s AND tenant_id = %(tenant_id)s;


-- name: attempt_mark_sent --
UPDATE ledger_attempt SET sent_at = COALESCE(sent_at, now())
WHERE tenant_id = %(tenant_id)s AND operation_id = %(operation_id)s AND number = %(number)s;


-- name: attempt_job --
-- The job an asynchronous provider accepted the attempt as: its id and the submit's status.
-- The attempt stays pending until the job ends.
UPDATE ledger_attempt SET
    provider_ref = %(provider_ref)s,
    response_status = %(response_status)s
WHERE tenant_id = %(tenant_id)s AND operation_id = %(operation_id)s AND number = %(number)s;


-- name: attempt_succeed --
UPDATE ledger_attempt SET
    outcome = {attempt_succeeded},
    finished_at = now(),
    provider_ref = %(provider_ref)s,
    response_status = %(response_status)s
WHERE tenant_id = %(tenant_id)s AND operation_id = %(operation_id)s AND number = %(number)s;


-- name: attempt_finish --
-- A failed attempt's outcome and evidence.
UPDATE ledger_attempt SET
    outcome = %(outcome)s,
    finished_at = COALESCE(finished_at, now()),
    error_class = %(error_class)s,
    message = %(message)s,
    response_status = %(response_status)s
WHERE tenant_id = %(tenant_id)s AND operation_id = %(operation_id)s AND number = %(number)s;


-- name: event_insert --
-- Every transition's trace, in the same transaction as the move (append-only).
INSERT INTO ledger_operationevent (tenant_id, operation_id, from_status, to_status, actor, reason, attempt, at)
VALUES (%(tenant_id)s, %(operation_id)s, %(from_status)s, %(to_status)s, %(actor)s, %(reason)s, %(attempt)s, now());


-- Rate and concurrency caps (ledger.providers.ratelimit; DESIGN §5, rate and concurrency caps). A
-- capped provider's take runs provider_rate_refill (which locks its bucket row until the take
-- commits), provider_in_flight, the operation_take of as many rows as both allow, then
-- provider_rate_spend, all in the take's transaction. The same row holds a provider's effective
-- in-flight limit after a 429 (`concurrency`, ADR 0008): any provider that was throttled has
-- one, declared caps or not; NULL = not lowered (the declared max_in_flight, or none, holds).


-- name: provider_rate_insert --
-- A capped (or throttled) provider's bucket, full, at its declared rate (0 for a provider that
-- declares none), its in-flight limit not lowered; a row that exists is left alone.
INSERT INTO ledger_providerrate (
    tenant_id, provider_id, tokens, rate, refilled_at, quiet_since, lowered_at, next_take_at,
    concurrency, concurrency_since, concurrency_quiet_since, concurrency_reason
)
VALUES (%(tenant_id)s, %(provider_id)s, %(burst)s, %(ceiling)s, now(), now(), NULL, NULL, NULL, NULL, NULL, '')
ON CONFLICT (provider_id) DO NOTHING;


-- name: provider_rate_refill --
-- Lock the bucket and refill it for the time since the last refill at the effective rate, up
-- to the burst. The effective rate never exceeds the declared one (%(ceiling)s, calls per
-- second) and climbs back by %(step)s (additive increase) once it has been quiet — no 429,
-- no step — for %(quiet_seconds)s. A lowered in-flight limit climbs back by 1 once it has been
-- quiet for %(concurrency_quiet_seconds)s; reaching %(concurrency_cap)s (the declared max_in_flight, or
-- the deployment's default for a provider that declares none) it is no longer lowered (NULL).
-- Every SET reads the row as it was before this statement.
UPDATE ledger_providerrate SET
    tokens = LEAST(%(burst)s, tokens + rate * GREATEST(0.0, ledger_seconds_since(refilled_at))),
    rate = CASE
        WHEN rate < %(ceiling)s AND ledger_seconds_since(quiet_since) >= %(quiet_seconds)s
        THEN LEAST(%(ceiling)s, rate + %(step)s)
        ELSE LEAST(%(ceiling)s, rate)
    END,
    quiet_since = CASE
        WHEN rate < %(ceiling)s AND ledger_seconds_since(quiet_since) >= %(quiet_seconds)s THEN now()
        ELSE quiet_since
    END,
    -- PostgreSQL's now() is the transaction's start, which may precede the previous taker's:
    -- the clock of the bucket never runs backwards (nor credits the same time twice).
    refilled_at = GREATEST(refilled_at, now()),
    concurrency = CASE
        WHEN concurrency IS NOT NULL AND ledger_seconds_since(concurrency_quiet_since) >= %(concurrency_quiet_seconds)s
        THEN CASE WHEN concurrency + 1 >= %(concurrency_cap)s THEN NULL ELSE concurrency + 1 END
        ELSE concurrency
    END,
    concurrency_since = CASE
        WHEN concurrency IS NOT NULL AND ledger_seconds_since(concurrency_quiet_since) >= %(concurrency_quiet_seconds)s
        THEN now()
        ELSE concurrency_since
    END,
    concurrency_quiet_since = CASE
        WHEN concurrency IS NOT NULL AND ledger_seconds_since(concurrency_quiet_since) >= %(concurrency_quiet_seconds)s
        THEN now()
        ELSE concurrency_quiet_since
    END,
    concurrency_reason = CASE
        WHEN concurrency IS NOT NULL AND ledger_seconds_since(concurrency_quiet_since) >= %(concurrency_quiet_seconds)s
            AND concurrency + 1 >= %(concurrency_cap)s
        THEN ''
        ELSE concurrency_reason
    END
WHERE provider_id = %(provider_id)s AND tenant_id = %(tenant_id)s
RETURNING tokens, rate, concurrency;


-- name: provider_in_flight --
-- A capped provider's calls in flight: its claimed execute-mode rows, over every worker, read
-- off the work queue's mirror (open_exec_inflight_idx, ADR 0017), which the take's own
-- operation_take updated in the same statement. Read after provider_rate_refill locked the
-- bucket, so it sees every row the provider's previous taker committed.
SELECT COUNT(*) FROM ledger_open_operation
WHERE tenant_id = %(tenant_id)s AND provider_id = %(provider_id)s AND status = {claimed} AND mode = 'execute';


-- name: provider_rate_spend --
-- The calls this take started leave the bucket; never below empty. %(wait_seconds)s: how long
-- until it holds a whole call again (NULL: it does now), so takes pass the provider over until then.
UPDATE ledger_providerrate SET
    tokens = tokens - %(taken)s,
    next_take_at = ledger_now_plus(%(wait_seconds)s)
WHERE provider_id = %(provider_id)s AND tenant_id = %(tenant_id)s AND tokens >= %(taken)s;


-- name: provider_rate_lower --
-- A 429 (or a 503 with Retry-After) to a call sent after the last lowering: the effective rate
-- is multiplied by %(factor)s (multiplicative decrease), never below %(floor)s calls per second,
-- and the bucket emptied; the effective in-flight limit (the declared cap, or %(concurrency_cap)s,
-- when not lowered) is halved, never below 1, with %(reason)s saying why (ADR 0008). An answer to
-- a call sent before the last lowering is the same storm: it only restarts both quiet periods. The send time is the operation's own sent marker (the
-- take's now()) — for a poll (polls > 0: a poll lease's row), the poll take's claimed_at, since
-- the sent marker is the submit's —, so both sides of the comparison are the database's clock.
UPDATE ledger_providerrate SET
    rate = CASE WHEN lowered_at IS NULL OR lowered_at < sent.at THEN GREATEST(%(floor)s, rate * %(factor)s) ELSE rate END,
    tokens = CASE WHEN lowered_at IS NULL OR lowered_at < sent.at THEN 0.0 ELSE tokens END,
    lowered_at = CASE WHEN lowered_at IS NULL OR lowered_at < sent.at THEN now() ELSE lowered_at END,
    quiet_since = now(),
    -- (Integer division on both databases: both sides are integers.)
    concurrency = CASE
        WHEN lowered_at IS NULL OR lowered_at < sent.at
        THEN GREATEST(1, LEAST(CAST(%(concurrency_cap)s AS INTEGER), COALESCE(concurrency, CAST(%(concurrency_cap)s AS INTEGER))) / 2)
        ELSE concurrency
    END,
    concurrency_since = CASE WHEN lowered_at IS NULL OR lowered_at < sent.at THEN now() ELSE concurrency_since END,
    concurrency_reason = CASE WHEN lowered_at IS NULL OR lowered_at < sent.at THEN %(reason)s ELSE concurrency_reason END,
    concurrency_quiet_since = now()
FROM (
    SELECT CASE WHEN polls > 0 THEN claimed_at ELSE sent_at END AS at
    FROM ledger_operation WHERE id = %(operation_id)s AND tenant_id = %(tenant_id)s
) AS sent
WHERE provider_id = %(provider_id)s AND tenant_id = %(tenant_id)s
RETURNING rate, concurrency;


-- name: provider_rate_reset --
-- The provider's caps changed: its bucket starts again, full, at the declared rate, and its
-- in-flight limit as declared.
UPDATE ledger_providerrate SET
    tokens = %(burst)s, rate = %(ceiling)s, refilled_at = now(), quiet_since = now(),
    lowered_at = NULL, next_take_at = NULL,
    concurrency = NULL, concurrency_since = NULL, concurrency_quiet_since = NULL, concurrency_reason = ''
WHERE provider_id = %(provider_id)s AND tenant_id = %(tenant_id)s;



-- Search rows of operations written before them (ADR 0018; ledger.store.search_rows): the
-- backfill, batch by batch of ids in (after, upto], each batch its own short transaction.
-- Idempotent (an operation that has the row is skipped), so a batch run twice, or a pass
-- resumed anywhere, writes each row once.


-- name: operation_search_fill_identifiers --
-- operation_search_append of the claim's identifiers, set-wise, for operations without them.
INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
SELECT o.id,
       COALESCE((SELECT MAX(s.seq) FROM ledger_operation_search s
                 WHERE s.operation_id = o.id AND s.tenant_id = o.tenant_id), -1) + 1,
       o.tenant_id, FALSE,
       o.key || %(sep)s || o.reconciliation_handle || %(sep)s || o.execution_id || %(sep)s || o.correlation_id
FROM ledger_operation o
WHERE o.id > %(after)s AND o.id <= %(upto)s
  AND NOT EXISTS (
      SELECT 1 FROM ledger_operation_search s
      WHERE s.operation_id = o.id AND s.tenant_id = o.tenant_id AND NOT s.ref
        AND s.text = o.key || %(sep)s || o.reconciliation_handle || %(sep)s || o.execution_id || %(sep)s || o.correlation_id)
ON CONFLICT DO NOTHING;


-- name: operation_search_fill_refs --
-- operation_search_append of the provider reference, set-wise, for operations without it.
INSERT INTO ledger_operation_search (operation_id, seq, tenant_id, ref, text)
SELECT o.id,
       COALESCE((SELECT MAX(s.seq) FROM ledger_operation_search s
                 WHERE s.operation_id = o.id AND s.tenant_id = o.tenant_id), -1) + 1,
       o.tenant_id, TRUE, o.provider_ref
FROM ledger_operation o
WHERE o.id > %(after)s AND o.id <= %(upto)s AND o.provider_ref <> ''
  AND NOT EXISTS (
      SELECT 1 FROM ledger_operation_search s
      WHERE s.operation_id = o.id AND s.tenant_id = o.tenant_id AND s.ref AND s.text = o.provider_ref)
ON CONFLICT DO NOTHING;
