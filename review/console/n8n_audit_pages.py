"""The console's workflow audit page (dlq.n8n.audit): the findings of each workflow of a
tenant's n8n, read through the tenant's n8n connection when the page is asked for one tenant.
Read-only — nothing is stored, nothing in n8n changes — and for the roles that may see the n8n
connection (``dlq.view_n8nconnection``), scoped to the user's tenants."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from dlq.models import N8nConnection
from dlq.n8n.audit import AuditUnavailable, n8n_workflows_audit
from review.staff.tenancy import scope_of

PERMISSION = "dlq.view_n8nconnection"


def n8n_audit_page(site: admin.AdminSite, request: HttpRequest) -> HttpResponse:
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied("The workflow audit needs the permission to see the n8n connection.")
    scope = scope_of(request)
    connections = N8nConnection.objects.select_related("tenant").order_by("tenant__slug")
    if scope is not None:
        connections = connections.filter(tenant_id__in=scope)
    connections = list(connections)
    chosen = None
    wanted = request.GET.get("tenant", "")
    if wanted.isdigit():
        chosen = next((c for c in connections if c.tenant_id == int(wanted)), None)
    elif len(connections) == 1:
        chosen = connections[0]
    report, problem = None, ""
    if chosen is not None:
        try:
            report = n8n_workflows_audit(tenant_id=chosen.tenant_id)
        except AuditUnavailable as exc:
            problem = exc.detail
    context = {
        **site.each_context(request),
        "title": "n8n workflow audit",
        "connections": connections,
        "chosen": chosen,
        "report": report,
        "problem": problem,
    }
    response = TemplateResponse(request, "admin/dlq/n8n_audit.html", context, status=200)
    response["Cache-Control"] = "no-store"
    return response
