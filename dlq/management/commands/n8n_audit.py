"""``manage.py n8n_audit [--tenant SLUG] [--json]``: the workflow audit (dlq.n8n.audit) of a
tenant's n8n — or of every tenant with an n8n connection — read through the connection's API
key (scopes ``workflow:list`` and ``workflow:read``). Read-only: nothing is stored or changed
in n8n or here. Exits 1 when a connection's workflows cannot be read, 0 otherwise (findings
are a report, not an error)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dlq.models import N8nConnection
from dlq.n8n.audit import AuditUnavailable, n8n_workflows_audit
from ledger.models import Tenant


class Command(BaseCommand):
    help = (
        "List, per workflow of the connected n8n, side-effect nodes without an Onceguard claim, keys built from"
        " execution ids, time or random values, side effects without an error path, and saved successful executions."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="the tenant's slug (default: every tenant with an n8n connection)")
        parser.add_argument("--json", action="store_true", help="one JSON document on standard output")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"No tenant {options['tenant']!r}.")
            tenants = [tenant]
        else:
            ids = N8nConnection.objects.values_list("tenant_id", flat=True)
            tenants = list(Tenant.objects.filter(pk__in=ids).order_by("slug"))
            if not tenants:
                raise CommandError("No tenant has an n8n connection (manage.py n8n_connect).")
        documents: list[dict[str, Any]] = []
        failed = 0
        for tenant in tenants:
            try:
                report = n8n_workflows_audit(tenant_id=tenant.pk)
            except AuditUnavailable as exc:
                failed += 1
                documents.append({"tenant": tenant.slug, "error": exc.detail})
                if not options["json"]:
                    self.stderr.write(f"{tenant.slug}: {exc.detail}")
                continue
            documents.append({"tenant": tenant.slug, **report.as_dict()})
            if not options["json"]:
                self._write_text(tenant.slug, report)
        if options["json"]:
            self.stdout.write(json.dumps({"tenants": documents}, indent=2, ensure_ascii=False))
        if failed:
            raise CommandError(f"The workflows of {failed} tenant(s) could not be read.")

    def _write_text(self, slug: str, report: Any) -> None:
        flagged = sum(1 for w in report.workflows if w.findings)
        self.stdout.write(
            f"{slug}: {report.base_url} — {len(report.workflows)} workflow(s), {flagged} with findings,"
            f" {report.findings} finding(s)" + (" (listing stopped: too many pages)" if report.truncated else "")
        )
        for workflow in report.workflows:
            state = "active" if workflow.active else "inactive"
            self.stdout.write(f"  {workflow.name} [{workflow.id}, {state}]: {len(workflow.findings)} finding(s)")
            for finding in workflow.findings:
                where = f"{finding.node}: " if finding.node else ""
                self.stdout.write(f"    - {finding.code}: {where}{finding.message}")
                self.stdout.write(f"      fix: {finding.fix} ({finding.fix_path})")
