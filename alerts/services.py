"""Alerts: written as rows in the transaction that causes them, delivered after commit.

``alert_raise`` is the seam the DLQ and retention call, and the receiver of the ledger's
``hooks.alert_raised`` (provider paused, review needed, operation stuck). It only writes (or
counts) an ``Alert`` row and asks django-q2 for a dispatch once the caller commits, so a
failing or hanging channel can never block or roll back the caller.

Dispatch hands each channel the alerts past its cursor (a guarded UPDATE moves the cursor,
so two dispatchers never take the same alerts): a few become one message each, many become
one digest, and a channel over its rate window waits for the next flush, which then sends a
digest. Messages carry ids, kinds, counts and console links — never payload text. Each
message is an ``AlertDelivery`` row, retried with backoff until it is sent or out of
attempts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone

from alerts.conf import alert_setting
from alerts.models import Alert, AlertChannel, AlertChannelKind, AlertDelivery, AlertDeliveryStatus
from ledger.models import ConfigChangeAction, Tenant
from ledger.platform import tasks as ledger_tasks
from ledger.platform.crypto import EncryptionKeyError
from ledger.platform.errors import ValidationFailed
from ledger.platform.masking import UNREADABLE
from ledger.platform.passes import failure_text, row_isolated
from ledger.providers.credentials import sealed_credential, secret_open, url_masked
from ledger.rules.outbound import OutboundBlocked, outbound_check, outbound_client
from ledger.tenants.config_changes import config_change_of, config_snapshot

log = logging.getLogger("onceguard.alerts")
# The label of this pass's failures (ledger.platform.passes).
JOB = "alert_digest"

MAX_SUMMARY = 300
# A digest lists at most this many alerts by id; the counts cover all of them.
DIGEST_LIST = 20
_DUE = (AlertDeliveryStatus.PENDING, AlertDeliveryStatus.RETRYING)
# Who resolves an alert whose condition has cleared (alerts.clearing).
SYSTEM_ACTOR = "system"


def alert_raise(*, tenant_id: int, kind: str, ref: str, summary: str) -> None:
    """Record an alert-worthy event (kind e.g. 'dlq_new', 'provider_paused', 'review_needed',
    'operation_stuck'); ``ref`` is an id or key, ``summary`` never carries payload text.

    Written in the caller's transaction. While an alert of this (kind, ref) is unresolved
    (open or acknowledged), raising it again only counts a repeat; after it was resolved, by
    a person or by the clearing evaluator (alerts.clearing), the raise opens the next
    episode: a new alert, delivered anew. Delivery is enqueued after the caller commits.
    """
    now = timezone.now()
    kind, ref = kind[:50], str(ref)[:255]
    same = Alert.objects.filter(tenant_id=tenant_id, kind=kind, ref=ref)
    if _repeat(same, now):
        return
    episode = (same.aggregate(last=Max("episode"))["last"] or 0) + 1
    dedup_key = f"{kind}:{ref}:e{episode}"[:400]
    # Inserted straight away (no get_or_create's read first): the episode was just found
    # free, so the read would find nothing but in a race, which the unique key catches.
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                tenant_id=tenant_id,
                dedup_key=dedup_key,
                kind=kind,
                ref=ref,
                episode=episode,
                summary=" ".join(summary.split())[:MAX_SUMMARY],
                created_at=now,
                last_raised_at=now,
            )
    except IntegrityError:
        # A concurrent raise opened this episode first: ours is a repeat of it. Any other
        # integrity error (no such alert to count on) is raised, not swallowed.
        if not Alert.objects.filter(tenant_id=tenant_id, dedup_key=dedup_key).update(
            repeat_count=F("repeat_count") + 1, last_raised_at=now
        ):
            raise
        return
    log.info("alert_raised tenant=%s kind=%s ref=%s alert=%s episode=%s", tenant_id, kind, ref, alert.pk, episode)
    # robust: a broker hiccup after commit is logged, never raised into the caller.
    transaction.on_commit(lambda: ledger_tasks.enqueue("alerts.tasks.alert_dispatch_task", tenant_id), robust=True)


def _repeat(same: Any, now: Any) -> bool:
    """Count a repeat on the unresolved alert of this (kind, ref), if there is one. Guarded on
    ``resolved_at IS NULL``: an alert resolved meanwhile is not counted on, the raise opens
    the next episode instead."""
    unresolved = same.filter(resolved_at__isnull=True).order_by("-pk").values_list("pk", flat=True).first()
    if unresolved is None:
        return False
    return bool(
        Alert.objects.filter(pk=unresolved, resolved_at__isnull=True).update(
            repeat_count=F("repeat_count") + 1, last_raised_at=now
        )
    )


# --- Acknowledge and resolve (console) ----------------------------------------------------------


def _alert_rows(*, alert_ids: list[int], tenant_ids: list[int] | None) -> Any:
    rows = Alert.objects.filter(pk__in=alert_ids)
    return rows if tenant_ids is None else rows.filter(tenant_id__in=tenant_ids)


def alert_acknowledge(*, alert_ids: list[int], actor: str, tenant_ids: list[int] | None = None) -> int:
    """Mark open alerts "someone is on it"; returns how many moved. A guarded UPDATE: an
    alert acknowledged or resolved meanwhile keeps its first answer and who gave it."""
    moved = (
        _alert_rows(alert_ids=alert_ids, tenant_ids=tenant_ids)
        .filter(acknowledged_at__isnull=True, resolved_at__isnull=True)
        .update(acknowledged_at=timezone.now(), acknowledged_by=actor[:150])
    )
    log.info("alerts_acknowledged count=%s actor=%s", moved, actor)
    return moved


def alert_resolve(*, alert_ids: list[int], actor: str, note: str = "", tenant_ids: list[int] | None = None) -> int:
    """Mark alerts dealt with (acknowledging them too, if nobody had); returns how many moved."""
    now = timezone.now()
    rows = _alert_rows(alert_ids=alert_ids, tenant_ids=tenant_ids).filter(resolved_at__isnull=True)
    with transaction.atomic():
        rows.filter(acknowledged_at__isnull=True).update(acknowledged_at=now, acknowledged_by=actor[:150])
        moved = rows.update(resolved_at=now, resolved_by=actor[:150], resolution_note=" ".join(note.split())[:500])
    log.info("alerts_resolved count=%s actor=%s", moved, actor)
    return moved


def alerts_resolve_for(*, tenant_id: int, kinds: list[str], ref: str, actor: str, note: str = "") -> int:
    """Resolve every unresolved alert of these kinds about ``ref`` (a key or an id): what
    follows a decision on the thing the alert was about (a review item decided)."""
    ids = list(
        Alert.objects.filter(tenant_id=tenant_id, kind__in=kinds, ref=ref, resolved_at__isnull=True).values_list(
            "pk", flat=True
        )[:1000]
    )
    return alert_resolve(alert_ids=ids, actor=actor, note=note) if ids else 0


def alert_resolve_cleared(*, alert_id: int, raised_at: datetime, note: str, now: datetime) -> bool:
    """The clearing evaluator's move (alerts.clearing): an open or acknowledged alert whose
    condition has passed is resolved by ``system`` with the reason, without acknowledging it
    (nobody was on it). Guarded: a person's resolution meanwhile keeps theirs, and an alert
    raised again since the evaluator read it (``last_raised_at`` moved: the condition came
    back) stays open until the next pass looks again."""
    moved = Alert.objects.filter(pk=alert_id, resolved_at__isnull=True, last_raised_at=raised_at).update(
        resolved_at=now, resolved_by=SYSTEM_ACTOR, resolution_note=" ".join(note.split())[:500]
    )
    return bool(moved)


# --- Messages ------------------------------------------------------------------------------


def _console(path: str) -> str:
    return str(alert_setting("CONSOLE_BASE_URL")).rstrip("/") + path


def alert_link(alert: Alert) -> str:
    ref = alert.ref
    if alert.kind.startswith("dlq") and ref.isdigit():
        return _console(f"/admin/dlq/failedevent/{ref}/change/")
    if alert.kind == "provider_paused":
        return _console("/admin/ledger/provider/")
    if alert.kind in ("provider_canary_rolled_back", "provider_canary_paused"):
        # The provider's slug: its page links the adapter rollout (revisions, the watch, the trail).
        return _console(f"/admin/ledger/provider/?{urlencode({'q': ref})}")
    if ref.isdigit():
        return _console(f"/admin/ledger/operation/{ref}/change/")
    # Otherwise a ledger key (never personal data, DESIGN §3): the console's search finds it.
    return _console(f"/admin/ledger/operation/?{urlencode({'q': ref})}")


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_body(*, channel: AlertChannel, tenant_slug: str, alerts: list[Alert], digest: bool) -> dict[str, Any]:
    """The body for one channel kind, from ids, kinds, counts and summaries only."""
    counts = Counter(a.kind for a in alerts)
    if digest:
        headline = f"[Onceguard · {tenant_slug}] {len(alerts)} alerts: " + ", ".join(
            f"{n} × {kind}" for kind, n in sorted(counts.items())
        )
        link = _console("/admin/dlq/failedevent/?status__exact=pending")
        listed = alerts[:DIGEST_LIST]
        lines = [f"{a.kind} {a.ref}" for a in listed]
        if len(alerts) > len(listed):
            lines.append(f"… and {len(alerts) - len(listed)} more")
    else:
        alert = alerts[0]
        headline = f"[Onceguard · {tenant_slug}] {alert.kind} {alert.ref}: {alert.summary}"
        link = alert_link(alert)
        lines = []
    if channel.kind == AlertChannelKind.SLACK:
        text = "\n".join([_slack_escape(headline), *(_slack_escape(line) for line in lines), f"<{link}|Open console>"])
        return {"text": text, "unfurl_links": False, "unfurl_media": False}
    if channel.kind == AlertChannelKind.DISCORD:
        content = "\n".join([headline, *lines, link])
        if len(content) > 2000:
            content = content[:1990] + "\n…"
        # No @everyone/@here/role pings, whatever a summary says.
        return {"username": "Onceguard", "content": content, "allowed_mentions": {"parse": []}}
    return {
        "type": "onceguard.alerts",
        "tenant": tenant_slug,
        "digest": digest,
        "count": len(alerts),
        "counts": dict(sorted(counts.items())),
        "alerts": [
            {
                "id": a.pk,
                "kind": a.kind,
                "ref": a.ref,
                "summary": a.summary,
                "created_at": a.created_at.isoformat(),
                "url": alert_link(a),
            }
            for a in (alerts[:DIGEST_LIST] if digest else alerts)
        ],
        "console_url": link,
    }


# --- Dispatch ------------------------------------------------------------------------------


def _take_alerts(channel: AlertChannel) -> tuple[list[Alert], int]:
    """Move the channel's cursor over every alert waiting for it.

    Returns the alerts and how many messages the rate window still allows; nothing is
    taken while the window is full (the next flush sends what waited as a digest).
    """
    waiting = Alert.objects.filter(tenant_id=channel.tenant_id, pk__gt=channel.cursor_alert_id)
    newest = waiting.aggregate(m=Max("id"))["m"]
    if newest is None:
        return [], 0
    recent = AlertDelivery.objects.filter(
        channel=channel, created_at__gte=timezone.now() - timedelta(seconds=channel.window_seconds)
    ).count()
    budget = channel.max_messages_per_window - recent
    if budget <= 0:
        return [], 0
    # Guarded: a second dispatcher that read the same cursor matches no row and backs off.
    moved = AlertChannel.objects.filter(pk=channel.pk, cursor_alert_id=channel.cursor_alert_id).update(
        cursor_alert_id=newest
    )
    if not moved:
        return [], 0
    taken = Alert.objects.filter(tenant_id=channel.tenant_id, pk__gt=channel.cursor_alert_id, pk__lte=newest).order_by(
        "id"
    )
    if channel.kinds:
        taken = taken.filter(kind__in=channel.kinds)
    alerts = list(taken)
    channel.cursor_alert_id = newest
    return alerts, budget


def _plan_deliveries(channel: AlertChannel, alerts: list[Alert], budget: int) -> list[AlertDelivery]:
    if not alerts:
        return []
    tenant_slug = Tenant.objects.filter(pk=channel.tenant_id).values_list("slug", flat=True).first() or "?"
    now = timezone.now()
    # One message per alert only while they fit both the digest threshold and the window.
    if len(alerts) <= channel.digest_threshold and len(alerts) <= budget:
        groups = [([a], False) for a in alerts]
    else:
        groups = [(alerts, True)]
    return [
        AlertDelivery(
            tenant_id=channel.tenant_id,
            channel=channel,
            alert_ids=[a.pk for a in group],
            alert_count=len(group),
            digest=digest,
            body=render_body(channel=channel, tenant_slug=tenant_slug, alerts=group, digest=digest),
            next_attempt_at=now,
        )
        for group, digest in groups
    ]


def alert_dispatch(*, tenant_id: int | None = None) -> dict[str, int]:
    """Hand waiting alerts to each active channel, then send every due delivery.

    No transaction is held while a channel is called: a hanging channel delays only this
    task, never a writer.
    """
    channels = AlertChannel.objects.filter(active=True)
    if tenant_id is not None:
        channels = channels.filter(tenant_id=tenant_id)
    planned = 0
    for channel in channels:
        # One channel whose alerts cannot be planned (its cursor stays, so they wait for the
        # next flush) does not stop the others' (ledger.platform.passes).
        with row_isolated(job=JOB, ref=f"channel={channel.pk}"):
            alerts, budget = _take_alerts(channel)
            if alerts:
                deliveries = _plan_deliveries(channel, alerts, budget)
                AlertDelivery.objects.bulk_create(deliveries)
                planned += len(deliveries)
    result = alert_deliver_due(tenant_id=tenant_id)
    result["planned"] = planned
    return result


def alert_deliver_due(*, tenant_id: int | None = None, limit: int = 200) -> dict[str, int]:
    due = AlertDelivery.objects.filter(
        status__in=_DUE, next_attempt_at__lte=timezone.now(), channel__active=True
    ).order_by("next_attempt_at", "id")
    if tenant_id is not None:
        due = due.filter(channel__tenant_id=tenant_id)
    counts = {"sent": 0, "failed": 0}
    for delivery_id in list(due.values_list("id", flat=True)[:limit]):
        # A delivery that raises records the error and waits its retry delay; the others go
        # out (ledger.platform.passes). The send is an HTTP call: no transaction around it.
        with row_isolated(
            job=JOB, ref=f"delivery={delivery_id}", on_failure=_delivery_failed(delivery_id), atomic=False
        ):
            outcome = alert_delivery_send(delivery_id=delivery_id)
            if outcome == AlertDeliveryStatus.SENT:
                counts["sent"] += 1
            elif outcome is not None:
                counts["failed"] += 1
    return counts


def _delivery_failed(delivery_id: int) -> Callable[[BaseException], None]:
    def record(exc: BaseException) -> None:
        delivery = AlertDelivery.objects.filter(pk=delivery_id, status__in=_DUE).first()
        if delivery is None:
            return
        dead = delivery.attempts >= int(alert_setting("MAX_ATTEMPTS"))
        AlertDelivery.objects.filter(pk=delivery_id, attempts=delivery.attempts).update(
            status=AlertDeliveryStatus.DEAD if dead else AlertDeliveryStatus.RETRYING,
            next_attempt_at=None if dead else timezone.now() + timedelta(seconds=_retry_delay(delivery.attempts)),
            last_error=failure_text(JOB, exc)[:300],
        )

    return record


def _retry_delay(attempts: int) -> float:
    base = float(alert_setting("RETRY_BASE_SECONDS"))
    return min(3600.0, base * (2 ** max(0, attempts - 1)))


def alert_delivery_send(*, delivery_id: int) -> str | None:
    """Send one delivery once. Returns its new status, or None if someone else has it."""
    delivery = AlertDelivery.objects.select_related("channel").filter(pk=delivery_id).first()
    if delivery is None or delivery.status not in _DUE:
        return None
    channel = delivery.channel
    now = timezone.now()
    # Take it like a lease: until this passes nobody else sends it; after a crash it is due again.
    hold = now + timedelta(seconds=channel.timeout_seconds + 30)
    taken = AlertDelivery.objects.filter(
        pk=delivery.pk, status__in=_DUE, attempts=delivery.attempts, next_attempt_at__lte=now
    ).update(attempts=F("attempts") + 1, next_attempt_at=hold)
    if not taken:
        return None
    attempts = delivery.attempts + 1
    error = ""
    retry_after: float | None = None
    try:
        url = channel_url(channel)
        # Through the outbound policy (ledger.rules.outbound): the webhook URL is checked again
        # after DNS, no redirect is followed and no proxy from the environment is used.
        with outbound_client(purpose=f"alert channel {channel.name}", timeout=channel.timeout_seconds) as client:
            response = client.post(url, json=delivery.body, headers={"User-Agent": "Onceguard-alerts"})
        if 200 <= response.status_code < 300:
            AlertDelivery.objects.filter(pk=delivery.pk, attempts=attempts).update(
                status=AlertDeliveryStatus.SENT, sent_at=timezone.now(), next_attempt_at=None, last_error=""
            )
            log.info("alert_sent channel=%s delivery=%s alerts=%s", channel.pk, delivery.pk, delivery.alert_count)
            return AlertDeliveryStatus.SENT
        error = f"HTTP {response.status_code}"
        if response.status_code == 429 and response.headers.get("Retry-After", "").isdigit():
            # At most a day: a channel's "9999…" must not overflow the next attempt's time.
            retry_after = min(float(response.headers["Retry-After"]), 86400.0)
    except EncryptionKeyError:
        error = "the webhook URL cannot be decrypted with the configured keys"
    except OutboundBlocked as exc:
        # Names the host or address refused, never the URL's path (the channel's token).
        error = str(exc)
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    status = AlertDeliveryStatus.RETRYING
    next_at: Any = timezone.now() + timedelta(seconds=max(_retry_delay(attempts), retry_after or 0))
    if attempts >= int(alert_setting("MAX_ATTEMPTS")):
        status, next_at = AlertDeliveryStatus.DEAD, None
    AlertDelivery.objects.filter(pk=delivery.pk, attempts=attempts).update(
        status=status, next_attempt_at=next_at, last_error=error[:300]
    )
    log.warning(
        "alert_delivery_failed channel=%s delivery=%s attempt=%s error=%s status=%s",
        channel.pk,
        delivery.pk,
        attempts,
        error,
        status,
    )
    return status


# --- Channels ------------------------------------------------------------------------------


# A channel's webhook URL lets anyone post to it; its delivery cursor is bookkeeping.
CHANNEL_SECRET_FIELDS = ("url",)
CHANNEL_STATE_FIELDS = ("cursor_alert_id",)


def channel_url(channel: AlertChannel) -> str:
    """The channel's webhook URL in clear: only to send to it. Raises ``EncryptionKeyError``
    when no configured key opens it."""
    return secret_open(channel.url)


def channel_url_masked(channel: AlertChannel) -> str:
    """What the console shows of the webhook URL: scheme, host and its last 4 characters."""
    try:
        return url_masked(channel_url(channel))
    except EncryptionKeyError:
        return UNREADABLE


NEW_CHANNEL_NEEDS_URL = "A new channel needs its webhook URL."


def alert_channel_upsert(
    *,
    tenant: Tenant,
    name: str,
    kind: str | None = None,
    url: str | None = None,
    kinds: list[str] | None = None,
    active: bool | None = None,
    timeout_seconds: float | None = None,
    digest_threshold: int | None = None,
    max_messages_per_window: int | None = None,
    window_seconds: int | None = None,
    actor: str = "system",
) -> AlertChannel:
    """Create or update a tenant's alert channel (Slack, Discord or generic webhook); the
    change is recorded (the webhook URL is a bearer secret: masked). The one write path of
    the console's form and ``manage.py alertchannel_upsert`` (ADR 0006): None keeps a stored
    value (a new channel needs its kind and URL; the rest take the model's defaults)."""
    # Checked and stored in canonical form (ledger.rules.outbound): where deliveries will go.
    checked = alert_channel_url_check(url) if url else None
    defaults: dict[str, Any] = {
        name_: value
        for name_, value in (
            ("kind", kind),
            ("kinds", kinds),
            ("active", active),
            ("timeout_seconds", timeout_seconds),
            ("digest_threshold", digest_threshold),
            ("max_messages_per_window", max_messages_per_window),
            ("window_seconds", window_seconds),
        )
        if value is not None
    }
    with transaction.atomic():
        existing = AlertChannel.objects.select_for_update().filter(tenant=tenant, name=name).first()
        before = config_snapshot(existing, exclude=CHANNEL_STATE_FIELDS) if existing is not None else None
        if existing is None and checked is None:
            raise ValidationFailed(NEW_CHANNEL_NEEDS_URL, extra={"field": "url"})
        if existing is None and kind is None:
            raise ValidationFailed("A new channel needs its kind.", extra={"field": "kind"})
        if checked is not None:
            # Sealed afresh only when it changed: the same URL again is no change in the trail.
            unchanged = existing is not None and _same_url(existing, checked)
            defaults["url"] = existing.url if unchanged else sealed_credential(checked)
        candidate = existing or AlertChannel(tenant=tenant, name=name)
        for field, value in defaults.items():
            setattr(candidate, field, value)
        try:
            # The model's own rules (a name is a short slug, a kind one of the kinds, counts
            # not negative), as the console's form checks them.
            candidate.full_clean(exclude=["tenant", "url", "cursor_alert_id"], validate_unique=False)
        except DjangoValidationError as exc:
            raise ValidationFailed("; ".join(exc.messages)) from None
        channel, created = AlertChannel.objects.update_or_create(tenant=tenant, name=name, defaults=defaults)
        config_change_of(
            channel,
            actor=actor,
            action=ConfigChangeAction.CREATE if created else ConfigChangeAction.UPDATE,
            before=before,
            secret_fields=CHANNEL_SECRET_FIELDS,
            exclude=CHANNEL_STATE_FIELDS,
        )
    return channel


def alert_channel_url_check(url: str) -> str:
    """A channel's webhook URL as stored: allowed by the outbound policy, canonical. The
    refusal names the purpose and the host at most, never the URL's path (a token)."""
    return outbound_check(url, purpose="alert webhook URL").url


def _same_url(channel: AlertChannel, url: str) -> bool:
    try:
        return channel_url(channel) == url
    except EncryptionKeyError:
        return False
