"""The providers' pages: configuration through ``services.provider_upsert`` (ADR 0006) with
write-only credentials and webhook secrets, the adapter rollout page (revisions, the canary's
watch, promote, roll back; ``ledger.providers.canary``), and prompt templates, whose "add" is
the name's next immutable version (``ledger.providers.prompts``)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import escape, format_html

from ledger.execution import rerun
from ledger.models import ADAPTER_FIELDS, ConfigChange, PromptTemplate, Provider, Tenant
from ledger.platform.errors import DomainError, ValidationFailed
from ledger.protocol import approvals, services
from ledger.providers import canary, prompts, ratelimit, revisions
from ledger.providers.credentials import credential_is_set
from ledger.recovery import recall
from ledger.rules.manifests import manifest_schema_check
from ledger.rules.provider_checks import secret_env_names
from ledger.web import display
from ledger.web.console_base import (
    HTTPS_URL_FORMS,
    ConsoleAdmin,
    ServiceSaveAdmin,
    TenantColumnMixin,
    https_url_formfield,
)


class ProviderForm(forms.ModelForm):
    """The provider's credential is write-only: typed to set or replace it, a box to clear
    it, never rendered back (ledger.providers.credentials). Provider.clean checks the URLs against the
    outbound policy and an environment reference against the tenant's declared set.

    A change of the adapter fields records the next adapter revision (ledger.providers.revisions): the
    stable one at once, or — with a canary percentage — a canary taking that share of new
    operations while the provider keeps its stable revision."""

    new_credential = forms.CharField(
        required=False,
        label="Credential",
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as the value of the auth header. Write-only: type a value to set or replace the stored"
        " one; it is stored encrypted and never shown again.",
    )
    clear_credential = forms.BooleanField(required=False, label="Clear the stored credential")
    # Asynchronous providers (ledger.execution.polling): the key the provider signs its webhooks with.
    new_webhook_secret = forms.CharField(
        required=False,
        label="Webhook secret",
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The key the provider signs its webhooks to /api/v1/webhooks/<tenant>/<provider> with"
        " (Onceguard-Signature, HMAC-SHA256). Write-only: stored encrypted and never shown again.",
    )
    clear_webhook_secret = forms.BooleanField(required=False, label="Clear the stored webhook secret")
    # Not named like the model's own (read-only) canary_percent: ModelAdmin would refuse it.
    rollout_percent = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=100,
        label="Roll out as a canary (%)",
        help_text="For a change of the adapter fields (base URL, headers, pointers, timeout, lookup): the new"
        " revision first takes this share of new operations, watched against the stable one and rolled back"
        " on its own if it fails more. Empty: the change applies to every new attempt at once.",
    )
    change_reason = forms.CharField(
        required=False,
        max_length=500,
        label="Reason for this change",
        help_text="Recorded with the adapter revision and in the configuration trail.",
    )

    class Meta:
        model = Provider
        fields = "__all__"
        formfield_callback = https_url_formfield

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        slug = data.get("slug")
        if self.instance.pk is None and slug:
            try:
                services.provider_slug_check(slug)
            except DomainError as exc:
                self.add_error("slug", exc.detail)
        if data.get("new_credential") and data.get("clear_credential"):
            raise forms.ValidationError("Set a new credential or clear it, not both.")
        if data.get("new_webhook_secret") and data.get("clear_webhook_secret"):
            raise forms.ValidationError("Set a new webhook secret or clear it, not both.")
        changed_adapter = [name for name in ADAPTER_FIELDS if name in self.changed_data]
        stored = self.instance if self.instance.pk is not None else None
        if data.get("rollout_percent") is not None:
            if stored is None:
                raise forms.ValidationError("A new provider has no stable revision to run a canary against.")
            if not changed_adapter:
                raise forms.ValidationError("A canary needs a change of the adapter fields.")
        if stored is not None and changed_adapter and stored.canary_revision_id is not None:
            raise forms.ValidationError(
                f"Revision {revisions.revision_number(stored.canary_revision_id)} runs as a canary: promote it or"
                " roll it back (Adapter rollout) before changing the adapter again."
            )
        return data

    def secret_changes(self) -> dict[str, str | None]:
        """The credential and webhook secret as ``services.provider_upsert`` takes them: a new
        value, "" to clear, None to keep (the service seals them)."""
        data = self.cleaned_data
        changes: dict[str, str | None] = {}
        for name, typed, cleared in (
            ("auth_secret", "new_credential", "clear_credential"),
            ("webhook_secret", "new_webhook_secret", "clear_webhook_secret"),
        ):
            changes[name] = "" if data.get(cleared) else (data.get(typed) or None)
        return changes


class RolloutMoveForm(forms.Form):
    reason = forms.CharField(max_length=500, help_text="Recorded with the move in the configuration trail.")
    number = forms.IntegerField(required=False, min_value=1, label="Revision")
    percent = forms.IntegerField(required=False, min_value=1, max_value=100, label="Canary share (%)")


@admin.register(Provider)
class ProviderAdmin(ServiceSaveAdmin):
    form = ProviderForm
    # Throttling and pausing are operational state, moved by the workers and the paused
    # providers' page, never configuration (services.PROVIDER_STATE_FIELDS).
    exclude = ["throttled_until", "paused_at", "paused_reason"]
    formfield_overrides = HTTPS_URL_FORMS
    list_display = [
        "slug",
        "tenant",
        "idempotency_class",
        "base_url",
        "credential_kind",
        "rollout_state",
        "max_attempts",
        "throttled_until",
        "paused_at",
    ]
    list_filter = ["tenant", "idempotency_class"]
    search_fields = ["slug", "base_url"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        field = form.base_fields.get("auth_secret_env")
        if field is not None:
            # Exactly which names the tenant may use (its stored secret namespace, ADR 0001).
            if obj is not None:
                allowed = f"this tenant may read {secret_env_names(obj.tenant.secret_namespace)}"
            else:
                tenants = form.base_fields["tenant"].queryset if "tenant" in form.base_fields else Tenant.objects.none()
                shown = [
                    f"{slug}: {secret_env_names(ns)}"
                    for slug, ns in tenants.values_list("slug", "secret_namespace")[:10]
                ]
                allowed = "each tenant may read only its own: " + ("; ".join(shown) or "—")
            # Escaped: the admin renders help texts as HTML, and <NAME> would vanish as a tag.
            field.help_text = escape(
                f"Read the credential from this environment variable of the workers' nodes — {allowed}."
                " Empty: no variable (or store the credential above)."
            )
        return form

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Slugs are how operations, claims and caches name a provider: fixed once created.
        # The four-eyes requirement is the platform's (ADR 0013): shown, not editable, to a
        # tenant's roles (provider_upsert refuses their change anyway).
        platform_owned = [] if request.user.is_superuser else list(services.PROVIDER_PLATFORM_FIELDS)
        if obj is None:
            return ["credential_state", "webhook_secret_state", *platform_owned]
        return [
            "tenant",
            "slug",
            "credential_state",
            "webhook_secret_state",
            "rollout_link",
            "caps_state",
            *platform_owned,
        ]

    @admin.display(description="webhook secret")
    def webhook_secret_state(self, obj: Provider) -> str:
        return "set (stored encrypted; never shown)" if obj.webhook_secret else "not set"

    @admin.display(description="rate and concurrency now")
    def caps_state(self, obj: Provider) -> str:
        # The declared caps and where they stand: calls in flight, the effective rate (lowered
        # by a 429, climbing back while quiet). ledger.providers.ratelimit.
        return ratelimit.provider_caps(obj).summary()

    @admin.display(description="credential")
    def credential_kind(self, obj: Provider) -> str:
        # The list's short form: never the value, never the variable's name.
        if credential_is_set(obj):
            return "stored"
        return "variable" if obj.auth_secret_env else display.EMPTY

    @admin.display(description="credential")
    def credential_state(self, obj: Provider) -> str:
        if credential_is_set(obj):
            return "set (stored encrypted; never shown)"
        if obj.auth_secret_env:
            return f"from the environment variable {obj.auth_secret_env}"
        return "not set"

    @admin.display(description="adapter revision")
    def rollout_state(self, obj: Provider) -> str:
        if obj.revision_id is None:
            return display.EMPTY
        text = f"r{revisions.revision_number(obj.revision_id)}"
        if obj.canary_revision_id is not None:
            text += f" · canary r{revisions.revision_number(obj.canary_revision_id)} at {obj.canary_percent} %"
        return text

    @admin.display(description="adapter rollout")
    def rollout_link(self, obj: Provider) -> str:
        url = reverse("admin:ledger_provider_rollout", args=[obj.pk])
        return format_html(
            '{} — <a href="{}" data-testid="rollout-link">revisions, canary, promote, roll back</a>',
            self.rollout_state(obj),
            url,
        )

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        # One write path (ADR 0006): the command's service checks, seals the secrets, records
        # the adapter revision and the ConfigChange row, resets the rate bucket and forgets the
        # cached copy — for the console as for `manage.py provider_upsert`.
        names = [
            field.name
            for field in Provider._meta.concrete_fields
            if field.name in form.cleaned_data and field.name not in ("tenant", "slug")
        ]
        if change:
            names = [name for name in names if name in form.changed_data]
        secrets_typed = form.secret_changes()
        saved = services.provider_upsert(
            tenant=obj.tenant,
            slug=obj.slug,
            actor=self.actor_of(request),
            # The four-eyes requirement is the platform's (ADR 0013): a superuser's save only.
            platform=request.user.is_superuser,
            reason=form.cleaned_data.get("change_reason") or "",
            canary_percent=form.cleaned_data.get("rollout_percent"),
            auth_secret=secrets_typed["auth_secret"],
            webhook_secret=secrets_typed["webhook_secret"],
            **{name: getattr(obj, name) for name in names},
        )
        self.adopt(obj, saved)

    # --- the adapter rollout page: revisions, the watch, promote / roll back / canary ---

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [path("<int:pk>/rollout/", wrap(self.rollout_view), name="ledger_provider_rollout")]
        return own + super().get_urls()

    def rollout_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        provider = get_object_or_404(self.get_queryset(request), pk=pk)
        may_move = request.user.has_perm("ledger.rollout_provider")
        form = RolloutMoveForm(request.POST or None)
        back = reverse("admin:ledger_provider_rollout", args=[provider.pk])
        if request.method == "POST":
            if not may_move:
                raise PermissionDenied
            verb = request.POST.get("verb", "")
            if verb not in ("canary", "promote", "rollback", "rerun"):
                messages.error(request, "Nothing changed: unknown action.")
            elif form.is_valid():
                data = form.cleaned_data
                actor = f"user:{request.user.get_username()}"
                tenants = [provider.tenant_id]
                try:
                    if verb == "canary":
                        if data["number"] is None or data["percent"] is None:
                            raise ValidationFailed("Name the revision and its share of new operations.")
                        canary.canary_start(
                            provider_id=provider.pk,
                            number=data["number"],
                            percent=data["percent"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = f"Revision {data['number']} runs as a canary at {data['percent']} %."
                    elif verb == "promote":
                        current = canary.revision_promote(
                            provider_id=provider.pk,
                            number=data["number"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = f"Revision {revisions.revision_number(current.revision_id)} is stable now."
                    elif verb == "rollback":
                        # Its outputs are recalled too (ADR 0020).
                        result, recalled = recall.revision_rollback_recall(
                            provider_id=provider.pk,
                            number=data["number"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = (
                            f"Revision {result.rolled_back} rolled back; revision {result.stable} is stable;"
                            f" {result.requeued} operation(s) re-queued under it; outputs recalled:"
                            f" {recalled['quarantined']} quarantined, {recalled['flagged']} flagged."
                        )
                    else:
                        if data["number"] is None:
                            raise ValidationFailed("Name the rolled-back revision whose outputs are re-run.")
                        rerun_result = rerun.recalled_outputs_rerun(
                            tenant_id=provider.tenant_id,
                            provider_id=provider.pk,
                            number=data["number"],
                            actor=actor,
                            reason=data["reason"],
                            tenant_ids=tenants,
                        )
                        done = (
                            f"{len(rerun_result.rerun)} recalled output(s) of revision {data['number']} re-run as the"
                            f" next versions of their keys under revision {rerun_result.stable}."
                        )
                except approvals.ApprovalPending as pending:
                    messages.warning(
                        request, f"Nothing sent yet: approval request #{pending.request.pk} waits for a second person."
                    )
                    return HttpResponseRedirect(back)
                except DomainError as exc:
                    messages.error(request, f"Nothing changed: {exc.detail}")
                else:
                    messages.success(request, done)
                    return HttpResponseRedirect(back)
        provider.refresh_from_db()
        trail = ConfigChange.objects.filter(
            Q(object_type="ledger.provider", object_id=str(provider.pk))
            | Q(
                object_type="ledger.adapterrevision",
                object_id__in=[str(i) for i in provider.revisions.values_list("pk", flat=True)],
            ),
        ).order_by("-at", "-id")[:30]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Adapter rollout: {provider}",
            "provider": provider,
            "rollout": canary.provider_rollout(provider),
            "trail": trail,
            "form": form,
            "may_move": may_move,
            "change_url": reverse("admin:ledger_provider_change", args=[provider.pk]),
        }
        return TemplateResponse(request, "admin/ledger/provider/rollout.html", context)


class PromptTemplateForm(forms.ModelForm):
    """A new version of a prompt template (ledger.providers.prompts): the name's next version is the
    service's to number; versions are never edited."""

    reason = forms.CharField(
        required=False, max_length=500, help_text="Recorded with the version in the configuration trail."
    )
    # Without the model field's own length and shape rules: the service's check says what a
    # name may be, in the words the command and the API use.
    name = forms.CharField(help_text="Lower case letters, digits, - and _ (at most 63).")

    class Meta:
        model = PromptTemplate
        fields = ["tenant", "name", "text", "slots", "manifest_schema"]
        help_texts = {
            "manifest_schema": "Optional: the JSON Schema the evaluation manifests of jobs pinned to this version"
            " must match (ADR 0022).",
            "text": "The instructions, with {{ slot }} where each declared slot's user text goes (fenced between"
            " markers, capped). Nothing else in braces.",
            "slots": 'Each slot with its length cap: {"description": {"max_length": 500}}.',
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        try:
            # The service's own check (ADR 0006): the same message as the command's and the API's.
            prompts.prompt_template_check(name=data.get("name"), text=data.get("text"), slots=data.get("slots"))
            manifest_schema_check(data.get("manifest_schema"))
        except DomainError as exc:
            raise forms.ValidationError(exc.detail) from None
        return data


@admin.register(PromptTemplate)
class PromptTemplateAdmin(TenantColumnMixin, ConsoleAdmin):
    """Prompt templates: read-only versions; "add" creates the name's next version through
    ``prompts.prompt_template_create`` (DESIGN §5, prompt templates)."""

    form = PromptTemplateForm
    list_display = ["name", "version", "slot_caps", "created_by", "created_at", "reason", "compare_link"]
    list_filter = ["name"]
    search_fields = ["name"]
    ordering = ["name", "-version"]

    @admin.display(description="slots")
    def slot_caps(self, obj: PromptTemplate) -> str:
        return ", ".join(f"{name} ≤ {spec.get('max_length')}" for name, spec in obj.slots.items()) or display.EMPTY

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def get_urls(self) -> list[Any]:
        wrap = self.admin_site.admin_view
        own = [path("<int:pk>/compare/", wrap(self.compare_view), name="ledger_prompttemplate_compare")]
        return own + super().get_urls()

    def compare_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """This version against another of the same name (``?with=N``; default the one before):
        a unified diff of the text and the slots. A version that is not there is a 400 that says
        so, never a 5xx."""
        prompt = get_object_or_404(self.get_queryset(request), pk=pk)
        versions = list(
            self.get_queryset(request)
            .filter(tenant_id=prompt.tenant_id, name=prompt.name)
            .order_by("version")
            .values_list("version", flat=True)
        )
        wanted = request.GET.get("with", "")
        problem = ""
        other = None
        if wanted:
            number = int(wanted) if wanted.isdigit() and len(wanted) < 10 else None
            if number is None or number not in versions:
                problem = (
                    f"{prompt.name} has no version {wanted[:20]!r}: choose one of {', '.join(map(str, versions))}."
                )
            else:
                other = number
        elif prompt.version > 1:
            other = prompt.version - 1
        against = (
            self.get_queryset(request).get(tenant_id=prompt.tenant_id, name=prompt.name, version=other)
            if other is not None
            else None
        )
        older, newer = (
            (against, prompt) if against is not None and against.version < prompt.version else (prompt, against)
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Compare prompt template {prompt}",
            "prompt": prompt,
            "versions": versions,
            "against": against,
            "problem": problem,
            "lines": prompts.prompt_template_diff(older, newer) if against is not None and newer is not None else [],
            "change_url": reverse("admin:ledger_prompttemplate_change", args=[prompt.pk]),
        }
        return TemplateResponse(
            request, "admin/ledger/prompttemplate/compare.html", context, status=400 if problem else 200
        )

    @admin.display(description="diff")
    def compare_link(self, obj: PromptTemplate) -> str:
        if obj.version <= 1:
            return display.EMPTY
        url = reverse("admin:ledger_prompttemplate_compare", args=[obj.pk])
        # Short: the list already holds the longest columns a template has (slots, reason).
        return format_html(
            '<a href="{}" title="Compare with version {}">v{}</a>', url, obj.version - 1, obj.version - 1
        )

    def save_model(self, request: HttpRequest, obj: PromptTemplate, form: Any, change: bool) -> None:
        created = prompts.prompt_template_create(
            tenant=obj.tenant,
            name=obj.name,
            text=obj.text,
            slots=obj.slots,
            actor=f"user:{request.user.get_username()}",
            reason=form.cleaned_data.get("reason") or "",
            manifest_schema=obj.manifest_schema,
        )
        # The admin's redirect and message name the row the service wrote.
        obj.pk, obj.version, obj.created_at = created.pk, created.version, created.created_at
