"""What a person does to entries from the console, always through a service (each change
leaves its FailedEventChange or Replay row): an entry's action pages — replay (with a preview
of where it goes, with which key and what it sends), correct and replay as the next version,
set the key of an entry that has none, record "safe to resend", resolve, discard — and the
list's bulk actions (the count shown before confirming).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from dlq.entries import selectors
from dlq.entries import services as dlq_entries
from dlq.entries.payloads import is_redacted, open_payload
from dlq.models import FailedEvent, FailedEventStatus, KeySource, ReplayAck, ReplayOutcome, ReplayTarget
from dlq.replays import bulk as dlq_bulk
from dlq.replays import corrections as dlq_corrections
from dlq.replays import services as dlq_replays
from dlq.rules.conf import dlq_setting
from dlq.web.console.common import actor_of, replay_failure
from ledger.models import Tenant
from ledger.platform.errors import DomainError
from ledger.platform.masking import mask_json
from ledger.protocol import approvals
from ledger.providers.credentials import url_masked
from ledger.web import display
from ledger.web.console_base import ConsoleJSONField, pending_message
from ledger.web.pagination import COUNT_CAP


def needs_key(event: FailedEvent) -> bool:
    """A pending entry with no usable key, never replayed: the console sets its key before it
    offers the replay (an entry replayed before keeps its course)."""
    return (
        event.status == FailedEventStatus.PENDING and event.key_source == KeySource.MISSING and not event.replay_count
    )


class _TargetChoice(forms.ChoiceField):
    def __init__(self, tenant_id: int, **kwargs: Any):
        targets = ReplayTarget.objects.filter(tenant_id=tenant_id, active=True).order_by("slug")
        choices = [("", "the entry's target (or the tenant's default)")] + [
            (t.slug, f"{t.slug} → {t.url}{' (default)' if t.is_default else ''}") for t in targets
        ]
        super().__init__(choices=choices, required=False, **kwargs)


class ReplayForm(forms.Form):
    note = forms.CharField(required=False, max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))
    force = forms.BooleanField(required=False, help_text="Replay an entry that was replayed successfully already.")
    as_new = forms.BooleanField(
        required=False,
        label="Re-run as new",
        help_text="Send a derived key {key}~r{n} instead of the original one: the receiver will NOT dedup it "
        "against the first try. Only for receivers that cached the first failure.",
    )
    confirm = forms.BooleanField(required=False, label="I confirm the re-run as new")

    def __init__(self, *args: Any, tenant_id: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["target"] = _TargetChoice(tenant_id)


class NoteForm(forms.Form):
    note = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}))


class KeyForm(forms.Form):
    """The key an entry with no usable key is replayed under (``failed_event_key_set``, in
    dlq.entries.services, checks it by the key rule; a refusal names the rule broken)."""

    key = forms.CharField(
        label="Idempotency key",
        max_length=255,
        strip=False,
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "lead:call_7f3c2a9e:crm-contact:v1"}),
        help_text="1–255 printable ASCII characters, no blanks around it, no e-mail address or phone number: "
        "the record id the receiver deduplicates on.",
    )
    note = forms.CharField(
        max_length=500, required=False, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}), label="Why (optional)"
    )


class CorrectForm(forms.Form):
    """A quarantined entry replayed with corrected fields as the next version."""

    fields_json = ConsoleJSONField(
        label="Corrected fields",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60, "placeholder": '{"body.amount": 1200}'}),
        help_text="JSON: dotted path → corrected value. Execute mode: paths into the stored request (body.…); "
        "guard mode: into the stored payload. The stored payload is not changed.",
    )
    note = forms.CharField(
        label="Why",
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required: recorded with your name and the fields you changed.",
    )

    def __init__(self, *args: Any, tenant_id: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["target"] = _TargetChoice(tenant_id, label="Replay target (guard mode)")

    def clean_fields_json(self) -> dict[str, Any]:
        value = self.cleaned_data["fields_json"]
        if not isinstance(value, dict) or not value:
            raise forms.ValidationError("An object of dotted paths and their corrected values.")
        return value


class FailedEventActions:
    """The entry's own pages (replay, correct, set the key, "safe to resend", resolve,
    discard: each a form, then the service, then back to the entry) and the list's bulk
    actions, with who may use them. Mixed into ``FailedEventAdmin``; every change goes
    through a service, which leaves its change or Replay row."""

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dlq.replay_failedevent")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("dlq.resolve_failedevent")

    # --- per-entry actions (change page buttons) ---

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [
            path("<int:pk>/replay/", wrap(self.replay_view), name="dlq_failedevent_replay"),
            path("<int:pk>/correct/", wrap(self.correct_view), name="dlq_failedevent_correct"),
            path("<int:pk>/set-key/", wrap(self.set_key_view), name="dlq_failedevent_set_key"),
            path("<int:pk>/resend-decision/", wrap(self.resend_decision_view), name="dlq_failedevent_resend_decision"),
            path(
                "<int:pk>/resolve/",
                wrap(self.close_view),
                {"to": FailedEventStatus.RESOLVED},
                name="dlq_failedevent_resolve",
            ),
            path(
                "<int:pk>/discard/",
                wrap(self.close_view),
                {"to": FailedEventStatus.DISCARDED},
                name="dlq_failedevent_discard",
            ),
        ]
        return own + super().get_urls()

    def _entry(self, request: HttpRequest, pk: int) -> FailedEvent:
        # get_queryset is tenant-scoped by the console: another tenant's entry is a 404.
        return get_object_or_404(self.get_queryset(request), pk=pk)

    def _change_url(self, pk: int) -> str:
        return reverse("admin:dlq_failedevent_change", args=[pk])

    def _entry_action(
        self,
        request: HttpRequest,
        pk: int,
        *,
        allowed: bool,
        form: Callable[[FailedEvent], forms.Form],
        act: Callable[[FailedEvent, dict[str, Any]], tuple[int, str]],
        refused: str,
        title: str,
        button: str,
        preview: Callable[[FailedEvent], dict[str, Any]] | None = None,
    ) -> HttpResponse:
        """One entry's action page: its form; on a valid POST the service call (``act``: the
        message level and text it answers with), then back to the entry; a refusal (a domain
        error) is said as "``refused``: why" above the form again."""
        if not allowed:
            raise PermissionDenied
        event = self._entry(request, pk)
        bound = form(event)
        if request.method == "POST" and bound.is_valid():
            try:
                level, message = act(event, bound.cleaned_data)
            except approvals.ApprovalPending as pending:
                # Four-eyes (ADR 0013): nothing was sent; the request waits for a second person.
                messages.info(request, pending_message(pending))
                return HttpResponseRedirect(self._change_url(event.pk))
            except DomainError as exc:
                messages.error(request, f"{refused}: {exc.detail}")
            else:
                messages.add_message(request, level, message)
                return HttpResponseRedirect(self._change_url(event.pk))
        return self._form_page(
            request, event, bound, title=title, button=button, preview=preview(event) if preview else None
        )

    def replay_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        def replay(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            replay = dlq_replays.failed_event_replay(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                actor=actor_of(request),
                target_slug=data["target"],
                force=data["force"],
                note=data["note"],
                as_new=data["as_new"],
                confirm=data["confirm"],
            )
            if replay.outcome == ReplayOutcome.SUCCEEDED:
                answer = f"HTTP {replay.response_status}" if replay.response_status else "delivered"
                return messages.SUCCESS, f"Replay #{replay.number} to {replay.target_slug}: succeeded ({answer})."
            return messages.WARNING, format_html(
                "Replay #{} to {}: {} — {}",
                replay.number,
                replay.target_slug,
                replay.outcome,
                replay_failure(replay) or "no error recorded",
            )

        if self.has_replay_permission(request) and needs_key(self._entry(request, pk)):
            # Replayed under its own identity, no receiver could tell it from a new request:
            # the key is set first (set_key_view), then the replay is offered.
            messages.warning(request, f"Entry {pk} has no usable key: set the key it is replayed under first.")
            return HttpResponseRedirect(reverse("admin:dlq_failedevent_set_key", args=[pk]))
        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: ReplayForm(request.POST or None, tenant_id=event.tenant_id),
            act=replay,
            refused="Not replayed",
            title=f"Replay entry {pk}",
            button="Replay now",
            preview=lambda event: self._replay_preview(event, target_slug=request.POST.get("target", "")),
        )

    def _replay_preview(self, event: FailedEvent, *, target_slug: str) -> dict[str, Any]:
        """Where the replay goes, with which key, and what it sends (masked): shown before
        the button, from the same resolution the service uses."""
        preview: dict[str, Any] = {"key": event.original_key or event.event_id}
        try:
            target = selectors.replay_target_resolve(
                tenant_id=event.tenant_id, slug=target_slug or event.replay_target_slug
            )
        except DomainError as exc:
            preview["problem"] = exc.detail
        else:
            preview.update(
                url=url_masked(target.url),
                header=target.idempotency_header,
                target=target.slug,
                target_class=target.get_idempotency_class_display(),
                target_ack="delivered only on its Onceguard-Ack"
                if target.ack == ReplayAck.ECHO
                else "any 2xx counts as delivered",
                # Why it would wait for a person, in words, with the button to decide.
                waits=selectors.replay_wait_reason(event=event, target=target),
                decide_url=reverse("admin:dlq_failedevent_resend_decision", args=[event.pk]),
            )
        if is_redacted(event.payload):
            preview["body"] = "(redacted by retention: nothing to replay)"
        else:
            try:
                preview["body"] = json.dumps(mask_json(open_payload(event.payload)), indent=2, ensure_ascii=False)
            except Exception:  # a key that is not configured: say so, never break the page
                preview["body"] = "(sealed with a key that is not configured)"
        preview["as_new_key"] = dlq_replays.derive_new_key(preview["key"], event.replay_count + 1)
        return preview

    def set_key_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Set the key of an entry that has no usable one (dlq.entries.services'
        ``failed_event_key_set``), then back to the entry, whose replay is offered from then on."""

        def set_key(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            changed = dlq_entries.failed_event_key_set(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                key=data["key"],
                actor=actor_of(request),
                note=data["note"],
            )
            return messages.SUCCESS, f"Key of entry {event.pk} set to {changed.original_key}: it can be replayed now."

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: KeyForm(request.POST or None),
            act=set_key,
            refused="Key not set",
            title=f"Set the key of entry {pk} before its replay",
            button="Set the key",
        )

    def correct_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Replay with corrected fields as the next version of the key (dlq.replays.corrections'
        ``failed_event_correct``)."""

        def correct(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            result = dlq_corrections.failed_event_correct(
                tenant_id=event.tenant_id,
                event_pk=event.pk,
                actor=actor_of(request),
                fields=data["fields_json"],
                note=data["note"],
                target_slug=data["target"],
            )
            done = (
                f"submitted as operation {result.operation.pk}"
                if result.operation is not None
                else f"replay #{result.replay.number}: {result.replay.outcome}"  # type: ignore[union-attr]
            )
            return messages.SUCCESS, f"Corrected and sent again as {result.key} ({done})."

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: CorrectForm(request.POST or None, tenant_id=event.tenant_id),
            act=correct,
            refused="Not corrected",
            title=f"Correct entry {pk} and replay it as the next version",
            button="Correct and replay",
        )

    def resend_decision_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """Record the decision "safe to resend" (a reason required) for an entry whose first
        try may have acted and whose target is key-advisory: the next replay is sent once."""

        def decide(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            dlq_entries.failed_event_resend_decide(
                tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=data["note"]
            )
            return (
                messages.SUCCESS,
                f'Decision "safe to resend" recorded for entry {event.pk}: the next replay is sent.',
            )

        return self._entry_action(
            request,
            pk,
            allowed=self.has_replay_permission(request),
            form=lambda event: NoteForm(request.POST or None),
            act=decide,
            refused="Not recorded",
            title=f'Entry {pk}: record the decision "safe to resend"',
            button="Safe to resend",
        )

    def close_view(self, request: HttpRequest, pk: int, to: str) -> HttpResponse:
        change = (
            dlq_entries.failed_event_resolve if to == FailedEventStatus.RESOLVED else dlq_entries.failed_event_discard
        )

        def close(event: FailedEvent, data: dict[str, Any]) -> tuple[int, str]:
            change(tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=data["note"])
            return messages.SUCCESS, f"Entry {event.pk} marked {to}."

        verb = "Resolve" if to == FailedEventStatus.RESOLVED else "Discard"
        return self._entry_action(
            request,
            pk,
            allowed=self.has_resolve_permission(request),
            form=lambda event: NoteForm(request.POST or None),
            act=close,
            refused="Not changed",
            title=f"{verb} entry {pk}",
            button=verb,
        )

    def _form_page(
        self,
        request: HttpRequest,
        event: FailedEvent,
        form: forms.Form,
        *,
        title: str,
        button: str,
        preview: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {
            "preview": preview,
            "status_badge": display.badge(event.status, event.get_status_display()),
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "event": event,
            "form": form,
            "button": button,
            "back_url": self._change_url(event.pk),
        }
        return TemplateResponse(request, "admin/dlq/failedevent/action_form.html", context)

    # --- bulk actions (count shown before confirming) ---

    @admin.action(description="Replay selected entries…", permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        tenant_ids = set(queryset.values_list("tenant_id", flat=True).distinct()[:2])
        if len(tenant_ids) != 1:
            messages.error(request, "A bulk replay works on one tenant's entries at a time.")
            return None
        tenant = Tenant.objects.get(pk=tenant_ids.pop())
        if request.POST.get("bulk_confirm"):
            try:
                bulk = dlq_bulk.bulk_replay_confirm(
                    tenant=tenant,
                    bulk_id=int(request.POST["bulk_id"]),
                    actor=actor_of(request),
                    count=int(request.POST["bulk_count"]),
                    target_slug=request.POST.get("target", ""),
                    note=request.POST.get("note", ""),
                )
            except approvals.ApprovalPending as pending:
                messages.info(request, pending_message(pending))
                return None
            except (DomainError, ValueError, KeyError) as exc:
                messages.error(request, f"Not started: {getattr(exc, 'detail', 'bad request')}")
                return None
            messages.success(request, f"Bulk replay #{bulk.pk} of {bulk.count} entries started (paced).")
            return None
        try:
            bulk = dlq_bulk.bulk_replay_prepare(
                tenant=tenant,
                filters={},
                actor=actor_of(request),
                event_pks=list(queryset.values_list("pk", flat=True)[: COUNT_CAP + 1]),
            )
        except DomainError as exc:
            messages.error(request, f"Not prepared: {exc.detail}")
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Confirm bulk replay",
            "bulk": bulk,
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "ticked": queryset.count(),
            "target_field": _TargetChoice(tenant.pk).widget.render("target", ""),
            "action": "replay_selected",
            "rate": dlq_setting("BULK_REPLAY_PER_SECOND"),
            "waiting": selectors.replay_waiting(tenant_id=tenant.pk, event_ids=bulk.event_ids),
        }
        return TemplateResponse(request, "admin/dlq/failedevent/bulk_confirm.html", context)

    def _bulk_close(self, request: HttpRequest, queryset: QuerySet[FailedEvent], to: str) -> HttpResponse | None:
        note = request.POST.get("note", "").strip()
        if request.POST.get("bulk_confirm") and note:
            fn = (
                dlq_entries.failed_event_resolve
                if to == FailedEventStatus.RESOLVED
                else dlq_entries.failed_event_discard
            )
            done = skipped = 0
            for event in queryset.only("pk", "tenant_id")[:COUNT_CAP]:
                try:
                    fn(tenant_id=event.tenant_id, event_pk=event.pk, actor=actor_of(request), note=note)
                    done += 1
                except DomainError:
                    skipped += 1
            messages.success(request, f"{done} entries marked {to}; {skipped} skipped (not pending or replayed).")
            return None
        if request.POST.get("bulk_confirm"):
            messages.error(request, "A note is required.")
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Mark entries {to}",
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "ticked": queryset.count(),
            "action": f"{'resolve' if to == FailedEventStatus.RESOLVED else 'discard'}_selected",
            "to": to,
        }
        return TemplateResponse(request, "admin/dlq/failedevent/bulk_confirm.html", context)

    @admin.action(description="Resolve selected entries…", permissions=["resolve"])
    def resolve_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        return self._bulk_close(request, queryset, FailedEventStatus.RESOLVED)

    @admin.action(description="Discard selected entries…", permissions=["resolve"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[FailedEvent]) -> HttpResponse | None:
        return self._bulk_close(request, queryset, FailedEventStatus.DISCARDED)
