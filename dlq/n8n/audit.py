"""The workflow audit: what in a tenant's n8n workflows can send twice, fail unseen or keep
people's data — read through the tenant's n8n connection (``dlq.n8n.api.workflows_list``)
and shown in the console (dlq.audit_pages) and by ``manage.py n8n_audit``.

``workflow_audit`` is pure (a workflow's JSON in, findings out); ``n8n_workflows_audit``
fetches and applies it. Per workflow:

* ``unguarded_side_effect`` — a side-effect node (HTTP Request to anything but Onceguard, a
  CRM, e-mail, SMS or payment node) with no Onceguard claim upstream: a re-sent webhook or
  n8n's Retry runs the effect again.
* ``volatile_key`` — the key of an Onceguard claim or submission built from
  ``$execution.id``, ``$now``/``$today``, ``Date.now()``/``new Date()`` or a random value
  (``$randomInt``, ``Math.random``, a uuid): every execution gets a new key, so the claim
  guards nothing.
* ``no_error_path`` — a side-effect node without an error output (``onError:
  continueErrorOutput`` with something connected to it) in a workflow without an error
  workflow (``settings.errorWorkflow``): its failure reaches no DLQ and no person.
* ``success_executions_saved`` — ``settings.saveDataSuccessExecution`` is not ``none``: n8n
  keeps every successful execution's data, the people in it included.

Each finding names the template or document that shows the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dlq.models import N8nConnection
from dlq.n8n.api import workflows_list
from dlq.n8n.client import FetchFailed
from ledger.platform.errors import DomainError
from ledger.providers.credentials import stored_credential_value


class AuditUnavailable(DomainError):
    status, code, title = 409, "n8n_audit_unavailable", "The n8n workflows cannot be read"


# Node types (the part after the package, without a trailing "Tool" — n8n's AI-tool variant
# of the same node) whose execution changes something outside n8n. Triggers never do.
HTTP_REQUEST = "httpRequest"
SIDE_EFFECT_KINDS: dict[str, frozenset[str]] = {
    "HTTP request": frozenset({HTTP_REQUEST}),
    "CRM": frozenset(
        {
            "activeCampaign",
            "affinity",
            "agileCrm",
            "copper",
            "freshworksCrm",
            "highLevel",
            "hubspot",
            "keap",
            "microsoftDynamicsCrm",
            "pipedrive",
            "salesforce",
            "salesmate",
            "zohoCrm",
        }
    ),
    "e-mail": frozenset(
        {
            "awsSes",
            "convertKit",
            "emailSend",
            "gmail",
            "mailchimp",
            "mailgun",
            "mailjet",
            "mandrill",
            "mautic",
            "microsoftOutlook",
            "sendGrid",
            "sendInBlue",
        }
    ),
    "SMS": frozenset({"messageBird", "mocean", "msg91", "plivo", "sms77", "twilio", "vonage", "whatsApp"}),
    "payment": frozenset({"chargebee", "paddle", "payPal", "quickbooks", "stripe", "wise", "xero"}),
}
# An HTTP Request to Onceguard itself is not a side effect (the templates' plain-HTTP
# variant reports to the DLQ that way); one to its claims endpoint is a claim.
ONCEGUARD_URL_MARKS = ("onceguard_url", "/api/v1/dlq/events", "/api/v1/claims")
CLAIMS_PATH = "/api/v1/claims"
# The key parameters of our node (integrations/n8n/nodes/Onceguard/descriptions.ts).
KEY_PARAMETERS = ("key", "record", "version")
CLAIM_OPERATION = "claim"
KEYED_OPERATIONS = frozenset({"claim", "submit"})
VOLATILE = (
    (re.compile(r"\$execution\.id"), "$execution.id"),
    (re.compile(r"\$now\b"), "$now"),
    (re.compile(r"\$today\b"), "$today"),
    (re.compile(r"Date\.now\s*\("), "Date.now()"),
    (re.compile(r"new\s+Date\s*\(\s*\)"), "new Date()"),
    (re.compile(r"\$randomInt|\$random\b"), "$randomInt"),
    (re.compile(r"Math\.random"), "Math.random()"),
    (re.compile(r"uuid", re.IGNORECASE), "a uuid"),
)

# Where each finding's fix is shown (paths in the repository).
FIXES: dict[str, tuple[str, str]] = {
    "unguarded_side_effect": (
        "Claim the business key before the effect, complete it after (template: guarded charge; leads: lead to CRM)",
        "integrations/n8n/workflows/guarded-charge.json",
    ),
    "volatile_key": (
        "Build the key from the business record (order id, call id), never the execution or the clock",
        "README.md#keys",
    ),
    "no_error_path": (
        "Connect the node's error output to the Dead-Letter node, or set the error workflow template",
        "integrations/n8n/workflows/error-workflow.json",
    ),
    "success_executions_saved": (
        'Set Workflow settings → "Save successful production executions" to "Do not save"; prune the rest',
        "review/README.md#n8ns-own-data",
    ),
}


@dataclass(frozen=True)
class Finding:
    code: str
    message: str
    node: str = ""

    @property
    def fix(self) -> str:
        return FIXES[self.code][0]

    @property
    def fix_path(self) -> str:
        return FIXES[self.code][1]

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "node": self.node,
            "message": self.message,
            "fix": self.fix,
            "fix_path": self.fix_path,
        }


@dataclass(frozen=True)
class WorkflowReport:
    id: str
    name: str
    active: bool
    side_effects: int
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "active": self.active,
            "side_effects": self.side_effects,
            "findings": [f.as_dict() for f in self.findings],
        }


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _base_type(node: dict[str, Any]) -> str:
    name = str(node.get("type") or "").rsplit(".", 1)[-1]
    return name.removesuffix("Tool") if name != "Tool" else name


def _texts(value: Any, depth: int = 0) -> Iterable[str]:
    if depth > 8:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v, depth + 1)


def _http_url(node: dict[str, Any]) -> str:
    return str(_dict(node.get("parameters")).get("url") or "")


def is_onceguard_node(node: dict[str, Any]) -> bool:
    return "onceguard" in str(node.get("type") or "").lower()


def _is_onceguard_http(node: dict[str, Any]) -> bool:
    url = _http_url(node).lower()
    return any(mark in url for mark in ONCEGUARD_URL_MARKS) or CLAIMS_PATH in url


def is_claim(node: dict[str, Any]) -> bool:
    """Our node's Claim (its default operation), or an HTTP Request to the claims endpoint."""
    if is_onceguard_node(node):
        return str(_dict(node.get("parameters")).get("operation") or CLAIM_OPERATION) == CLAIM_OPERATION
    return _base_type(node) == HTTP_REQUEST and CLAIMS_PATH in _http_url(node).lower()


def side_effect_kind(node: dict[str, Any]) -> str | None:
    """What the node changes outside n8n ("CRM", "payment", …), or None."""
    if is_onceguard_node(node) or node.get("disabled"):
        return None
    base = _base_type(node)
    if base.endswith("Trigger"):
        return None
    for kind, types in SIDE_EFFECT_KINDS.items():
        if base in types:
            if base == HTTP_REQUEST and _is_onceguard_http(node):
                return None
            return kind
    return None


def _edges(workflow: dict[str, Any]) -> dict[str, dict[int, set[str]]]:
    """source node → output index → target nodes, over every connection type."""
    edges: dict[str, dict[int, set[str]]] = {}
    for source, by_type in _dict(workflow.get("connections")).items():
        for outputs in _dict(by_type).values():
            for index, targets in enumerate(_list(outputs)):
                for target in _list(targets):
                    name = _dict(target).get("node")
                    if isinstance(name, str):
                        edges.setdefault(source, {}).setdefault(index, set()).add(name)
    return edges


def _upstream(name: str, parents: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for parent in parents.get(todo.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def _has_error_output(node: dict[str, Any], edges: dict[str, dict[int, set[str]]]) -> bool:
    # n8n adds the error output after the node's own outputs: the highest index connected.
    if node.get("onError") != "continueErrorOutput":
        return False
    outputs = edges.get(str(node.get("name")), {})
    return bool(outputs) and max(outputs) >= 1


def _key_texts(node: dict[str, Any]) -> list[str]:
    parameters = _dict(node.get("parameters"))
    if is_onceguard_node(node):
        if str(parameters.get("operation") or CLAIM_OPERATION) not in KEYED_OPERATIONS:
            return []
        return [t for p in KEY_PARAMETERS for t in _texts(parameters.get(p))]
    if is_claim(node):
        headers = _list(_dict(parameters.get("headerParameters")).get("parameters"))
        return [
            str(_dict(h).get("value") or "")
            for h in headers
            if str(_dict(h).get("name") or "").lower() in ("idempotency-key", "x-idempotency-key")
        ]
    return []


def workflow_audit(workflow: dict[str, Any]) -> WorkflowReport:
    """The findings of one workflow as n8n's API (or an export) gives it."""
    nodes = [n for n in _list(workflow.get("nodes")) if isinstance(n, dict) and isinstance(n.get("name"), str)]
    by_name = {n["name"]: n for n in nodes}
    edges = _edges(workflow)
    parents: dict[str, set[str]] = {}
    for source, outputs in edges.items():
        for targets in outputs.values():
            for target in targets:
                parents.setdefault(target, set()).add(source)
    settings = _dict(workflow.get("settings"))
    has_error_workflow = bool(str(settings.get("errorWorkflow") or "").strip())
    findings: list[Finding] = []
    side_effects = 0
    for node in nodes:
        name = node["name"]
        kind = side_effect_kind(node)
        if kind is not None:
            side_effects += 1
            upstream = _upstream(name, parents)
            if not any(is_claim(by_name[u]) for u in upstream if u in by_name and not by_name[u].get("disabled")):
                findings.append(
                    Finding(
                        "unguarded_side_effect",
                        f"{kind} node with no Onceguard claim before it: a re-sent trigger or n8n's Retry runs it again",
                        name,
                    )
                )
            if not has_error_workflow and not _has_error_output(node, edges):
                findings.append(
                    Finding(
                        "no_error_path",
                        "no error output connected and no error workflow: its failure reaches no DLQ and no person",
                        name,
                    )
                )
        if node.get("disabled"):
            continue
        volatile = sorted({label for text in _key_texts(node) for pattern, label in VOLATILE if pattern.search(text)})
        if volatile:
            findings.append(
                Finding(
                    "volatile_key",
                    f"the key is built from {', '.join(volatile)}: every execution gets a new key, so the claim"
                    " guards nothing",
                    name,
                )
            )
    saved = settings.get("saveDataSuccessExecution")
    if saved != "none":
        why = (
            f"successful executions are saved ({saved!s:.20})"
            if saved
            else "not set: the instance's EXECUTIONS_DATA_SAVE_ON_SUCCESS applies (n8n's default: all)"
        )
        findings.append(Finding("success_executions_saved", f"{why}: n8n keeps the data of every person it handled"))
    return WorkflowReport(
        id=str(workflow.get("id") or ""),
        name=str(workflow.get("name") or ""),
        active=bool(workflow.get("active")),
        side_effects=side_effects,
        findings=findings,
    )


@dataclass(frozen=True)
class AuditReport:
    base_url: str
    workflows: list[WorkflowReport]
    truncated: bool = False

    @property
    def findings(self) -> int:
        return sum(len(w.findings) for w in self.workflows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n8n": self.base_url,
            "workflows": [w.as_dict() for w in self.workflows],
            "findings": self.findings,
            "truncated": self.truncated,
        }


def n8n_workflows_audit(*, tenant_id: int) -> AuditReport:
    """Read the tenant's n8n workflows through its connection and audit each (read-only:
    nothing is stored). AuditUnavailable, in words safe to show, when they cannot be read."""
    connection = N8nConnection.objects.filter(tenant_id=tenant_id).first()
    if connection is None:
        raise AuditUnavailable("The tenant has no n8n connection (console: n8n connections; or manage.py n8n_connect).")
    api_key, why = stored_credential_value(connection.api_key_secret)
    if api_key is None:
        raise AuditUnavailable(f"The stored n8n API key cannot be used: {why or 'none is stored'}.")
    try:
        listed = workflows_list(base_url=connection.base_url, api_key=api_key, timeout=connection.timeout_seconds)
    except FetchFailed as exc:
        raise AuditUnavailable(f"The workflows could not be read: {exc.reason}.") from None
    reports = sorted((workflow_audit(w) for w in listed.items), key=lambda r: (-len(r.findings), r.name, r.id))
    return AuditReport(base_url=connection.base_url, workflows=reports, truncated=listed.truncated)
