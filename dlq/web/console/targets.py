"""Replay targets' pages: where replays go, written through ``dlq.targets.services`` (ADR
0006). The URL is shown masked past its host, the signing secret once when made or rotated,
the credential never; the list says which targets' class or acknowledgement nobody confirmed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dlq.models import ReplayAck, ReplayTarget
from dlq.targets import services as dlq_targets
from ledger.models import IdempotencyClass
from ledger.providers.credentials import url_masked
from ledger.web.console_base import HTTPS_URL_FORMS, ServiceSaveAdmin, https_url_formfield


class ReplayTargetForm(forms.ModelForm):
    """A new target must declare its class (the blank choice is refused); saving a class
    confirms it. The credential's value is write-only: typed to set or replace it, never
    rendered back, blank keeps the stored one. ReplayTarget.clean checks the URLs (outbound
    policy, https unless on this machine)."""

    idempotency_class = forms.ChoiceField(
        choices=[("", "— choose —"), *IdempotencyClass.choices],
        label="Idempotency class",
        help_text=ReplayTarget._meta.get_field("idempotency_class").help_text,
    )
    # Not required, so a save that leaves it out keeps the target's (or, for a new one, gets
    # the service's undeclared default: echo on the tenant's n8n, else status — the same as
    # the command's, ADR 0006); declaring it confirms it (ADR 0007).
    ack = forms.ChoiceField(
        choices=[("", "— not declared (echo on this tenant's n8n, else status) —"), *ReplayAck.choices],
        required=False,
        label="Acknowledgement",
        help_text=ReplayTarget._meta.get_field("ack").help_text,
    )
    new_credential = forms.CharField(
        required=False,
        label="Credential value",
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent in the credential header on every replay. Write-only: type a value to set or replace the"
        " stored one (stored encrypted, never shown again); leave blank to keep it.",
    )
    clear_credential = forms.BooleanField(required=False, label="Remove the stored credential")

    class Meta:
        model = ReplayTarget
        fields = [
            "tenant",
            "slug",
            "url",
            "idempotency_class",
            "ack",
            "idempotency_header",
            "lookup_url",
            "credential_header",
            "timeout_seconds",
            "is_default",
            "auto_replay",
            "active",
        ]
        formfield_callback = https_url_formfield

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and not self.instance.class_confirmed:
            # A migrated target: its key-advisory default is not a declaration; ask again.
            self.initial["idempotency_class"] = ""
        if self.instance.pk is None or not self.instance.ack_confirmed:
            # Migrated (or never declared): "status" is what it does, not a declaration; ask.
            self.initial["ack"] = ""

    def clean_ack(self) -> str:
        # Blank keeps what the target has: the model field is never set to "" (save_model
        # passes the declaration, or None, to the service).
        self.declared_ack = self.cleaned_data.get("ack") or None
        return self.declared_ack or self.instance.ack or ReplayAck.STATUS

    def clean_new_credential(self) -> str:
        value = self.cleaned_data.get("new_credential") or ""
        if value and not value.isprintable():
            raise forms.ValidationError("The credential must be printable text.")
        return value

    def credential_change(self) -> str | None:
        """The credential as ``replay_target_upsert`` (dlq.targets.services) takes it: a new
        value, "" to remove it, None to keep it (the service seals it)."""
        if self.cleaned_data.get("clear_credential"):
            return ""
        return self.cleaned_data.get("new_credential") or None


class AckFilter(admin.SimpleListFilter):
    title = "acknowledgement"
    parameter_name = "ack_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("unconfirmed", "not confirmed (migrated or not declared)"), *ReplayAck.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> QuerySet[ReplayTarget]:
        if self.value() == "unconfirmed":
            return queryset.filter(ack_confirmed=False)
        if self.value() in ReplayAck.values:
            return queryset.filter(ack=self.value())
        return queryset


class ClassConfirmedFilter(admin.SimpleListFilter):
    title = "class"
    parameter_name = "class_state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("unconfirmed", "not confirmed (migrated as key-advisory)"), *IdempotencyClass.choices]

    def queryset(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> QuerySet[ReplayTarget]:
        if self.value() == "unconfirmed":
            return queryset.filter(class_confirmed=False)
        if self.value() in IdempotencyClass.values:
            return queryset.filter(idempotency_class=self.value())
        return queryset


@admin.register(ReplayTarget)
class ReplayTargetAdmin(ServiceSaveAdmin):
    """Where replays go. The URL is shown masked past its host (a webhook path can be a
    token) and is not searchable; the signing secret is shown once, when made or rotated;
    the credential is write-only."""

    form = ReplayTargetForm
    list_display = [
        "slug",
        "tenant",
        "url_shown",
        "class_shown",
        "ack_shown",
        "idempotency_header",
        "is_default",
        "auto_replay",
        "active",
    ]
    list_filter = [ClassConfirmedFilter, AckFilter, "is_default", "auto_replay", "active"]
    search_fields = ["slug"]
    formfield_overrides = HTTPS_URL_FORMS
    readonly_fields = ["signing_state", "credential_state"]
    service_keys = ("tenant", "slug")
    actions = ["rotate_signing_secret"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Said by the list page itself: the console's mixin in front of every page
        # (review.console.pages.ConsoleAdminMixin) answers get_changelist with its own class and
        # never asks this page's. GET only, so an action's post and its redirect do not say it
        # twice.
        if request.method == "GET":
            self._unconfirmed_warnings(request)
        return super().changelist_view(request, extra_context)

    def _unconfirmed_warnings(self, request: HttpRequest) -> None:
        unconfirmed = self.get_queryset(request).filter(class_confirmed=False).count()
        if unconfirmed:
            # The dashboard hint: migrated targets whose class nobody declared yet.
            messages.warning(
                request,
                f"{unconfirmed} replay target(s) were migrated as key-advisory and wait for their class to be"
                " confirmed: open each and choose key-enforced or key-advisory.",
                fail_silently=True,
            )
        unacknowledged = self.get_queryset(request).filter(ack_confirmed=False).count()
        if unacknowledged:
            # Migrated targets count a bare 2xx as delivered, as they did: for an n8n receiver
            # that is n8n's answer to a workflow that stopped half-way (ADR 0007).
            messages.warning(
                request,
                f"{unacknowledged} replay target(s) count any 2xx as delivered and nobody confirmed it: for an n8n"
                " receiver, update its workflow to answer Onceguard-Ack (the replay-receiver template) and choose"
                " echo; keep status only for an API that refuses a second effect of a key.",
                fail_silently=True,
            )

    @admin.display(description="acknowledgement")
    def ack_shown(self, obj: ReplayTarget) -> str:
        return obj.ack if obj.ack_confirmed else f"{obj.ack} (not confirmed)"

    @admin.display(description="URL")
    def url_shown(self, obj: ReplayTarget) -> str:
        return url_masked(obj.url)

    @admin.display(description="class")
    def class_shown(self, obj: ReplayTarget) -> str:
        shown = obj.get_idempotency_class_display()
        return shown if obj.class_confirmed else f"{shown} (not confirmed)"

    @admin.display(description="signing secret")
    def signing_state(self, obj: ReplayTarget) -> str:
        return dlq_targets.replay_target_secret_summary(obj)

    @admin.display(description="credential")
    def credential_state(self, obj: ReplayTarget) -> str:
        if not obj.credential_secret:
            return "not set"
        return f"set, sent in {obj.credential_header or '(no header named)'} (stored encrypted; never shown)"

    def save_model(self, request: HttpRequest, obj: ReplayTarget, form: Any, change: bool) -> None:
        # One write path (ADR 0006): the command's service checks the URLs, seals the
        # credential, makes a new target's signing secret, moves the default and records
        # every target it changed.
        target = dlq_targets.replay_target_upsert(
            tenant=obj.tenant,
            slug=obj.slug,
            url=obj.url,
            idempotency_class=obj.idempotency_class,
            ack=getattr(form, "declared_ack", None),
            idempotency_header=obj.idempotency_header,
            lookup_url=obj.lookup_url,
            credential_header=obj.credential_header,
            credential_value=form.credential_change(),
            timeout_seconds=obj.timeout_seconds,
            is_default=obj.is_default,
            auto_replay=obj.auto_replay,
            active=obj.active,
            actor=self.actor_of(request),
        )
        self._new_secret = target.new_signing_secret
        self.adopt(obj, target)

    def response_add(self, request: HttpRequest, obj: ReplayTarget, post_url_continue: str | None = None) -> Any:
        secret = getattr(self, "_new_secret", "")
        if secret:
            return self._secret_once(request, obj, secret, made="made")
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Rotate the signing secret (shown once)", permissions=["change"])
    def rotate_signing_secret(self, request: HttpRequest, queryset: QuerySet[ReplayTarget]) -> HttpResponse | None:
        if queryset.count() != 1:
            messages.error(request, "Rotate one target's secret at a time: each new secret is shown once.")
            return None
        target = queryset.get()
        secret, _made = dlq_targets.replay_target_signing_secret(
            target_id=target.pk, rotate=True, actor=f"user:{request.user.get_username()}"
        )
        target.refresh_from_db()
        return self._secret_once(request, target, secret, made="rotated")

    def _secret_once(self, request: HttpRequest, target: ReplayTarget, secret: str, *, made: str) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": f"Signing secret of replay target {target.slug}",
            "opts": self.opts,
            "target": target,
            "secret": secret,
            "made": made,
            "summary": dlq_targets.replay_target_secret_summary(target),
        }
        response = TemplateResponse(request, "admin/dlq/replaytarget/secret_once.html", context)
        # Shown once: never cached, never kept in the session or a message cookie.
        response["Cache-Control"] = "no-store"
        return response
