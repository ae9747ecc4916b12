"""The console's run page: a run's steps in their checkpoint states, what is
safe to repeat, and the audited resume — the same reads and service as the API
(``dlq.replays.runs``), scoped to the user's tenants. The page itself is the preview: the steps it
marks are the ones the resume button re-drives, and the form carries their ids, so a run that
changed meanwhile is refused (``run_changed_since_preview``) instead of re-driving something
nobody saw."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from dlq.models import ReplayTarget, RunResume
from dlq.replays.runs import RunView, run_resume, run_view
from ledger.models import Checkpoint, Operation, Tenant
from ledger.platform.errors import DomainError
from ledger.protocol import approvals
from ledger.protocol.selectors import run_of
from ledger.web.console_base import pending_message
from review.staff.tenancy import scope_of


class RunFindForm(forms.Form):
    run = forms.CharField(label="Run id or correlation id", max_length=255)


class RunResumeForm(forms.Form):
    note = forms.CharField(
        label="Why",
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "e.g. CRM outage over (INC-311); resume the export"}),
        help_text="Required. Recorded with your name and the steps re-driven.",
    )
    target = forms.ChoiceField(label="Replay target (guard-mode steps)", required=False, choices=())
    operations = forms.CharField(widget=forms.HiddenInput)

    def __init__(self, *args: Any, targets: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["target"].choices = [("", "the entry's, else the tenant's default")] + [(t, t) for t in targets]

    def clean_operations(self) -> list[int]:
        text = self.cleaned_data["operations"]
        try:
            return [int(part) for part in text.split(",") if part]
        except ValueError:
            raise forms.ValidationError("The preview is not readable; reload the page.") from None


def _tenants_with_run(request: HttpRequest, run: str) -> list[Tenant]:
    """The user's tenants that have an operation in this run."""
    scope = scope_of(request)
    ops = Operation.objects.filter(run=run) | Operation.objects.filter(run="", correlation_id=run)
    if scope is not None:
        ops = ops.filter(tenant_id__in=scope)
    ids = sorted(set(ops.values_list("tenant_id", flat=True)[:1000]))
    return list(Tenant.objects.filter(pk__in=ids).order_by("slug"))


def run_page_url(site: admin.AdminSite, *, run: str, tenant_id: int | None = None) -> str:
    query = {"run": run, **({"tenant": tenant_id} if tenant_id is not None else {})}
    return f"{reverse(f'{site.name}:onceguard_run')}?{urlencode(query)}"


def operation_run_url(site: admin.AdminSite, op: Operation) -> str | None:
    """The run page of an operation's run, or None when it belongs to none."""
    run = run_of(run=op.run, correlation_id=op.correlation_id)
    return run_page_url(site, run=run, tenant_id=op.tenant_id) if run else None


def _summary(results: list[dict[str, Any]]) -> str:
    return "; ".join(f"{r.get('key')}: {r.get('outcome') or r.get('error') or 'not re-driven'}" for r in results)


def run_page(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm("ledger.view_operation"):
        raise PermissionDenied
    can_resume = request.user.has_perm("dlq.replay_failedevent")
    context: dict[str, Any] = {**site.each_context(request), "title": "Run", "can_resume": can_resume}
    find = RunFindForm(request.GET or None)
    context["find"] = find
    run = request.GET.get("run", "")
    if not run or not find.is_valid():
        return TemplateResponse(request, "admin/onceguard/run.html", context)
    tenants = _tenants_with_run(request, run)
    wanted = request.GET.get("tenant", "")
    chosen = [t for t in tenants if str(t.pk) == wanted] or (tenants if len(tenants) == 1 else [])
    context.update(run=run, tenants=tenants, title=f"Run {run}")
    if not chosen:
        # Not found in the user's tenants, or found in several: say so, link each.
        context["choices"] = [(t, run_page_url(site, run=run, tenant_id=t.pk)) for t in tenants]
        return TemplateResponse(request, "admin/onceguard/run.html", context, status=200 if tenants else 404)
    tenant = chosen[0]
    view: RunView = run_view(tenant_id=tenant.pk, run=run)
    targets = list(ReplayTarget.objects.filter(tenant=tenant, active=True).values_list("slug", flat=True))
    form = RunResumeForm(
        request.POST or None,
        targets=targets,
        initial={"operations": ",".join(str(s.operation.pk) for s in view.plan)},
    )
    here = run_page_url(site, run=run, tenant_id=tenant.pk)
    if request.method == "POST":
        if not can_resume:
            raise PermissionDenied("You do not have the permission to replay dead-lettered events.")
        if form.is_valid():
            try:
                resume = run_resume(
                    tenant_id=tenant.pk,
                    run=run,
                    actor=f"user:{request.user.get_username()}",
                    note=form.cleaned_data["note"],
                    target_slug=form.cleaned_data["target"],
                    expected=form.cleaned_data["operations"],
                )
            except approvals.ApprovalPending as pending:
                # Four-eyes (ADR 0013): nothing was re-driven; the request waits for a second person.
                messages.info(request, pending_message(pending))
                return HttpResponseRedirect(here)
            except DomainError as exc:
                messages.error(request, exc.detail)
            else:
                messages.success(request, f"Resumed {len(resume.results)} step(s): {_summary(resume.results)}.")
                return HttpResponseRedirect(here)
    context.update(
        tenant=tenant,
        view=view,
        steps=[
            {
                "step": s,
                "checkpoint_label": Checkpoint(s.checkpoint).label,
                "operation_url": reverse(f"{site.name}:ledger_operation_change", args=[s.operation.pk]),
                "current_url": reverse(f"{site.name}:ledger_operation_change", args=[s.current.pk])
                if s.current.pk != s.operation.pk
                else None,
                "entry_url": reverse(f"{site.name}:dlq_failedevent_change", args=[s.entry.pk])
                if s.entry is not None
                else None,
            }
            for s in view.steps
        ],
        form=form,
        resumes=[
            {"resume": r, "summary": _summary(r.results)}
            for r in RunResume.objects.filter(tenant=tenant, run=run).order_by("-at")[:20]
        ],
    )
    return TemplateResponse(request, "admin/onceguard/run.html", context)
