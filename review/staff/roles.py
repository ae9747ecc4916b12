"""Console roles as Django groups (DESIGN §6). The permissions of each role are declared here
and applied by migration review.0003 and again after every ``migrate`` (post_migrate), so a
permission another app adds later (a new DLQ model) reaches its roles without a new migration.

A role grants model permissions; which tenants' rows a user sees is a separate matter
(StaffTenant memberships, enforced by review.staff.tenancy).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from django.apps import apps as global_apps

OPERATOR, REVIEWER, AUDITOR, ADMIN = "operator", "reviewer", "auditor", "admin"
ROLES = (OPERATOR, REVIEWER, AUDITOR, ADMIN)

CONSOLE_APPS = ("ledger", "alerts", "dlq", "review")

# The ledger's history tables and the access log are never changed by hand (DESIGN §6);
# their admins refuse it anyway, and no role is even granted the permission.
_NEVER_BY_HAND = [
    f"{verb}_{model}"
    for verb in ("add", "change", "delete")
    for model in (
        "operation",
        "attempt",
        "operationevent",
        "accesslog",
        "accesslogcheckpoint",
        "configchange",
        "reviewitem",
        "subjectindex",
        "tombstone",
        "erasurerun",
        "attemptevidence",
    )
] + [f"{verb}_retentionrun" for verb in ("add", "change", "delete")]

_READ_LEDGER = [
    "ledger.view_operation",
    "ledger.view_attempt",
    "ledger.view_operationevent",
    "ledger.view_provider",
    "ledger.view_tenant",
    # Failed attempts' evidence (ADR 0016): no personal data, read by whoever reads attempts.
    "ledger.view_attemptevidence",
    # Four-eyes (ADR 0013): the re-sends waiting for a second person, theirs among them.
    "ledger.view_approvalrequest",
]

# app_label.codename patterns (fnmatch) per role.
ROLE_PERMISSIONS: dict[str, list[str]] = {
    OPERATOR: [
        *_READ_LEDGER,
        "alerts.view_*",
        "dlq.view_*",
        "dlq.replay_failedevent",
        "dlq.resolve_failedevent",
        "dlq.add_bulkreplay",
        "dlq.change_bulkreplay",
        "review.view_pausedprovider",
        "review.resume_provider",
        "review.view_reviewitem",
        "ledger.cancel_operation",
        "ledger.rollout_provider",
        # A restore's holds (ADR 0008): see them; release one, record it as performed, ask the lookup.
        "ledger.view_fencehold",
        "ledger.resolve_fencehold",
        "alerts.respond_alert",
    ],
    REVIEWER: [*_READ_LEDGER, "review.view_reviewitem", "review.decide_reviewitem"],
    AUDITOR: [
        "ledger.view_*",
        "alerts.view_*",
        "dlq.view_*",
        "review.view_*",
        "review.export_data",
        "review.search_subjects",
    ],
    # Everything a tenant's administrator configures; history stays service-only, and tenants,
    # users and their tenant memberships are a superuser's (users are not tenant-scoped): a
    # tenant's slug, limits, budgets, allow-list and eligibility URL are the platform's, and
    # its secret namespace is on no form (ADR 0001). Its admins see it and may rotate its
    # callback signing secret (their receivers' key), nothing else.
    ADMIN: [
        "ledger.view_*",
        "alerts.view_*",
        "dlq.view_*",
        "review.view_*",
        "ledger.add_provider",
        "ledger.change_provider",
        # A new version of a prompt template (versions are never changed or deleted).
        "ledger.add_prompttemplate",
        "ledger.change_apikey",
        "ledger.rotate_callback_secret",
        "dlq.replay_failedevent",
        "dlq.resolve_failedevent",
        "dlq.*_replaytarget",
        "dlq.*_n8nconnection",
        "alerts.*_alertchannel",
        "dlq.add_bulkreplay",
        "dlq.change_bulkreplay",
        "review.decide_reviewitem",
        "review.resume_provider",
        "ledger.cancel_operation",
        "ledger.rollout_provider",
        "ledger.resolve_fencehold",
        "alerts.respond_alert",
        "review.export_data",
        "review.search_subjects",
        "review.*_retentionpolicy",
        # Four-eyes (ADR 0013): the second person of a re-send is a tenant admin (or a person
        # granted the permission); never the one who asked, which the service refuses.
        "ledger.approve_approvalrequest",
        # Erasing a person's data on request (review.privacy.erasure): a tenant admin's decision;
        # auditors see the runs (view_erasurerun) and the trail, not the button.
        "review.erase_subject",
    ],
}


# Revealing payloads is its own decision: only the admin role has it (auditors see who
# looked and why, not the data itself — separation of duties). Grant it to a person, not a role,
# when someone else's work needs it.
_ADMIN_ONLY = ["review.view_payload"]


def _matches(perm: str, patterns: list[str], role: str) -> bool:
    app, _, codename = perm.partition(".")
    if codename in _NEVER_BY_HAND:
        return False
    if perm in _ADMIN_ONLY and role != ADMIN:
        return False
    return any(fnmatchcase(perm, p) for p in patterns)


def role_permission_codes(role: str, available: list[str]) -> list[str]:
    """The ``app.codename`` permissions of ``role`` among ``available``."""
    return sorted(p for p in available if _matches(p, ROLE_PERMISSIONS[role], role))


def sync_role_groups(apps: Any = None, using: str = "default") -> dict[str, int]:
    """Create the role groups and set their permissions exactly; returns counts per role."""
    if apps is None:
        apps = global_apps
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    rows = list(
        Permission.objects.using(using)
        .filter(content_type__app_label__in=CONSOLE_APPS)
        .values_list("pk", "content_type__app_label", "codename")
    )
    by_code = {f"{app}.{code}": pk for pk, app, code in rows}
    counts: dict[str, int] = {}
    for role in ROLES:
        group, _ = Group.objects.using(using).get_or_create(name=role)
        wanted = [by_code[c] for c in role_permission_codes(role, list(by_code))]
        group.permissions.set(wanted)
        counts[role] = len(wanted)
    return counts
