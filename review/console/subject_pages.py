"""The console's page of a person's data trail: the same reads and services
as the API (``review.privacy.subjects``, ``review.privacy.erasure``), scoped to the user's tenants.

Identifiers are typed into a POST form and never put in a URL (proxies, server logs and
browser history keep URLs); the answer is marked ``no-store``. Every lookup and export
writes an access-log row with the reason, and the page shows those rows in the trail.

Who may do what: the page needs ``review.search_subjects`` (auditors, admins); the exports
``review.export_data``; the export with the data in clear ``review.view_payload`` (the reveal
permission, admins only by default); an erasure ``review.erase_subject`` (admins) and a
ticked confirmation.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse

from ledger.models import Tenant
from ledger.platform.errors import DomainError
from review.audit.accesslog import accesslog_append
from review.console.run_pages import run_page_url
from review.models import AccessAction, RecordType
from review.privacy.erasure import erasure_request
from review.privacy.erasure_n8n import n8n_report
from review.privacy.payloads import MIN_REASON_LENGTH
from review.privacy.subject_apis import export_response
from review.privacy.subjects import Subject, Trail, erasure_summary, subject_kinds, subject_resolve, subject_trail
from review.staff.security import client_ip
from review.staff.tenancy import scope_of

ACTIONS = ("trail", "export_json", "export_csv", "erase")


class SubjectTrailForm(forms.Form):
    tenant = forms.ChoiceField(label="Tenant", choices=())
    email = forms.CharField(required=False, max_length=254, label="Email address")
    phone = forms.CharField(required=False, max_length=40, label="Phone number")
    reason = forms.CharField(
        min_length=MIN_REASON_LENGTH,
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "e.g. Access request AR-2291 (APP 12)"}),
        help_text="Required: looking up, exporting or erasing a person's data is logged with your reason.",
    )
    decrypt = forms.BooleanField(
        required=False,
        label="Include their data in clear (access request)",
        help_text="Decrypts every payload into the export; logged like a reveal.",
    )
    confirm_erase = forms.BooleanField(
        required=False,
        label="I confirm: erase this person's payloads everywhere in this tenant",
        help_text="Payloads become redaction markers; the records, their history and the access log stay.",
    )
    # Ticked by default, like the API's default with an n8n connection: n8n's execution
    # history is a full copy of the person's data (docs/adr/0005-erasure-reaches-n8n.md).
    delete_n8n_executions = forms.BooleanField(
        required=False,
        initial=True,
        label="Also delete the n8n executions that carried their data (through the tenant's n8n connection)",
        help_text="Executions that cannot be deleted (no connection, refused, unreachable) are listed on the run"
        " for removal by hand.",
    )

    def __init__(self, *args: Any, tenants: list[Tenant], extra_kinds: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [(str(t.pk), t.slug) for t in tenants]
        if len(tenants) == 1:
            self.fields["tenant"].initial = str(tenants[0].pk)
        self.extra_kinds = extra_kinds
        for kind in extra_kinds:
            self.fields[f"id_{kind}"] = forms.CharField(required=False, max_length=254, label=kind.replace("_", " "))

    def identifiers(self) -> dict[str, str]:
        data = self.cleaned_data
        found = {"email": data.get("email", ""), "phone": data.get("phone", "")}
        found.update({kind: data.get(f"id_{kind}", "") for kind in self.extra_kinds})
        return {k: v for k, v in found.items() if v and v.strip()}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.identifiers():
            raise forms.ValidationError("Give at least one identifier: an email address, a phone number, …")
        return data


def _record_url(site: admin.AdminSite, record_type: str, pk: int, gone: bool) -> str | None:
    if gone:
        return None
    name = "ledger_operation_change" if record_type == RecordType.OPERATIONS else "dlq_failedevent_change"
    try:
        return reverse(f"{site.name}:{name}", args=[pk])
    except NoReverseMatch:
        return None


def _trail_context(site: admin.AdminSite, trail: Trail) -> dict[str, Any]:
    records = [
        {
            "rec": rec,
            "url": _record_url(site, rec.record_type, rec.record_id, rec.payload == "deleted"),
            "run_url": run_page_url(site, run=rec.run, tenant_id=trail.tenant_id) if rec.run else None,
        }
        for rec in trail.records
    ]
    return {
        "trail": trail,
        "records": records,
        "events": trail.events,
        "erasures": [
            {"run": run, "summary": erasure_summary(run), "n8n_left": n8n_report(run)["left"]} for run in trail.erasures
        ],
        "counts": {
            "records": len(trail.records),
            "events": len(trail.events),
            "sealed": sum(1 for r in trail.records if r.payload == "sealed"),
        },
    }


def _log(
    request: HttpRequest, tenant_id: int, *, action: str, subject: Subject, reason: str, fields: list[str]
) -> None:
    accesslog_append(
        tenant_id=tenant_id,
        action=action,
        actor=f"user:{request.user.get_username()}",
        user_id=request.user.pk,
        object_type="subject",
        object_ref=subject.ref_text,
        fields=fields,
        reason=reason,
        ip=client_ip(request),
    )


def subject_trail_page(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    user = request.user
    if not user.has_perm("review.search_subjects"):
        raise PermissionDenied
    scope = scope_of(request)
    tenants = list(
        Tenant.objects.filter(pk__in=scope).order_by("slug") if scope is not None else Tenant.objects.order_by("slug")
    )
    extra_kinds = [k for k in subject_kinds() if k not in ("email", "phone")]
    form = SubjectTrailForm(request.POST or None, tenants=tenants, extra_kinds=extra_kinds)
    perms = {
        "export": user.has_perm("review.export_data"),
        "decrypt": user.has_perm("review.view_payload"),
        "erase": user.has_perm("review.erase_subject"),
    }
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "A person's data trail",
        "form": form,
        "perms_": perms,
        "extra_fields": [form[f"id_{k}"] for k in extra_kinds],
    }
    action = request.POST.get("action", "trail") if request.method == "POST" else ""
    if action and action not in ACTIONS:
        action = "trail"
    if action and form.is_valid():
        tenant_id = int(form.cleaned_data["tenant"])
        reason = form.cleaned_data["reason"]
        try:
            subject = subject_resolve(form.identifiers())
        except DomainError as exc:
            form.add_error(None, exc.detail)
        else:
            response = _act(site, request, form, action, tenant_id, subject, reason, perms, context)
            if response is not None:
                return response
    response = TemplateResponse(request, "admin/onceguard/subject_trail.html", context)
    response["Cache-Control"] = "no-store"
    return response


def _act(
    site: admin.AdminSite,
    request: HttpRequest,
    form: SubjectTrailForm,
    action: str,
    tenant_id: int,
    subject: Subject,
    reason: str,
    perms: dict[str, bool],
    context: dict[str, Any],
) -> HttpResponse | None:
    """Carry out ``action``; a download is returned, anything else fills ``context``."""
    if action in ("export_json", "export_csv"):
        decrypt = bool(form.cleaned_data.get("decrypt"))
        if not perms["export"] or (decrypt and not perms["decrypt"]):
            raise PermissionDenied(
                "You may not export this (it needs export_data, and view_payload for data in clear)."
            )
        fmt = action.removeprefix("export_")
        trail = subject_trail(tenant_id=tenant_id, subject=subject)
        _log(
            request,
            tenant_id,
            action=AccessAction.EXPORT,
            subject=subject,
            reason=reason,
            fields=[f"{fmt} export", "data in clear" if decrypt else "masked"],
        )
        return export_response(trail, fmt=fmt, decrypted=decrypt)
    if action == "erase":
        if not perms["erase"]:
            raise PermissionDenied("Erasing a person's data needs the erase_subject permission.")
        if not form.cleaned_data.get("confirm_erase"):
            form.add_error("confirm_erase", "Tick the confirmation to erase.")
        else:
            try:
                run, created = erasure_request(
                    tenant_id=tenant_id,
                    subject=subject,
                    actor=f"user:{request.user.get_username()}",
                    reason=reason,
                    ip=client_ip(request),
                    user_id=request.user.pk,
                    delete_n8n_executions=bool(form.cleaned_data.get("delete_n8n_executions")),
                )
            except DomainError as exc:
                messages.error(request, exc.detail)
            else:
                verb = "Erasure requested" if created else "An erasure of this person is already under way"
                messages.success(
                    request, f"{verb}: run #{run.pk}, {len(run.targets)} record(s). It continues in the background."
                )
    else:
        _log(request, tenant_id, action=AccessAction.SUBJECT_SEARCH, subject=subject, reason=reason, fields=["trail"])
    trail = subject_trail(tenant_id=tenant_id, subject=subject)
    context.update(_trail_context(site, trail))
    context["tenant"] = Tenant.objects.filter(pk=tenant_id).first()
    context["open_erasure"] = any(run.state != "done" for run in trail.erasures)
    return None
