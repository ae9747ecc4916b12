"""One write path per configuration object (ADR 0006): the console's form, the management
command and the API call the same service, so they refuse and accept the same inputs with the
same message (and, on the API, the same problem code) and write the same ConfigChange row.

Each object has a table of good and bad inputs. For every row, each path that exists for the
object runs in a savepoint of its own (rolled back after), starting from the same state; the
service called directly is the reference every path is compared with.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import Client

from alerts.services import alert_channel_upsert
from dlq.n8n.connections import n8n_connection_save
from dlq.targets.services import replay_target_upsert
from ledger.models import ConfigChange, Tenant
from ledger.platform.errors import DomainError
from ledger.protocol import callbacks, services
from ledger.providers import prompts
from review.retention.policies import retention_policy_save
from tests.console.support import client_for, submit_form

pytestmark = pytest.mark.django_db

# Fields every save changes on its own (times, bookkeeping): not part of what is compared.
VOLATILE = {"created_at", "api_key_set_at", "updated_at", "signing_secret", "secret_namespace"}


@dataclass
class Outcome:
    """What one path did: refused (with the messages it showed and, from the service or the
    API, the problem code) or saved (with the trail row it wrote)."""

    messages: list[str] = field(default_factory=list)
    code: str | None = None
    row: dict[str, Any] | None = None
    status: int | None = None

    @property
    def refused(self) -> bool:
        return self.row is None


def _row(object_type: str, since: int) -> dict[str, Any] | None:
    change = ConfigChange.objects.filter(object_type=object_type, pk__gt=since).order_by("-id").first()
    if change is None:
        return None
    after = {k: v for k, v in (change.after or {}).items() if k not in VOLATILE}
    return {
        # A new tenant's row belongs to it: its id comes from a sequence no savepoint rewinds.
        "tenant_id": "itself" if object_type == "ledger.tenant" else change.tenant_id,
        "action": change.action,
        "object_type": change.object_type,
        "object_repr": change.object_repr,
        "after": after,
        "actor_kind": change.actor.split(":")[0],
    }


def _last_change_id() -> int:
    return ConfigChange.objects.order_by("-id").values_list("id", flat=True).first() or 0


def _isolated(run: Callable[[], Outcome]) -> Outcome:
    """``run`` in a savepoint rolled back afterwards: every path starts from the same state."""
    sid = transaction.savepoint()
    try:
        return run()
    finally:
        transaction.savepoint_rollback(sid)


def by_service(object_type: str, call: Callable[[], Any]) -> Outcome:
    def run() -> Outcome:
        since = _last_change_id()
        try:
            with transaction.atomic():
                call()
        except DomainError as exc:
            return Outcome(messages=[exc.detail], code=exc.code)
        return Outcome(row=_row(object_type, since))

    return _isolated(run)


def by_command(object_type: str, *args: str, stdin: str = "") -> Outcome:
    def run() -> Outcome:
        since = _last_change_id()
        try:
            with transaction.atomic(), mock.patch("sys.stdin", io.StringIO(stdin)):
                call_command(*args, stdout=io.StringIO())
        except CommandError as exc:
            return Outcome(messages=[str(exc)])
        return Outcome(row=_row(object_type, since))

    return _isolated(run)


def by_console(client: Client, object_type: str, form_url: str, **changes: Any) -> Outcome:
    def run() -> Outcome:
        since = _last_change_id()
        response = submit_form(client, form_url, **changes)
        # Bad input is never a server error in the console.
        assert response.status_code < 500, response.content.decode()[:2000]
        row = _row(object_type, since)
        if row is not None:
            # Saved (a new replay target answers with its signing secret's page, 200).
            return Outcome(row=row, status=response.status_code)
        shown: list[str] = []
        if response.status_code == 200 and response.context and "adminform" in response.context:
            for errors in response.context["adminform"].form.errors.values():
                shown.extend(str(e) for e in errors)
        shown.extend(str(m) for m in get_messages(response.wsgi_request))
        return Outcome(messages=shown, status=response.status_code)

    return _isolated(run)


def by_api(client: Any, object_type: str, method: str, url: str, body: dict[str, Any]) -> Outcome:
    def run() -> Outcome:
        since = _last_change_id()
        response = getattr(client, method)(url, body, format="json")
        assert response.status_code < 500, response.content.decode()[:2000]
        if response.status_code >= 400:
            assert response["Content-Type"].startswith("application/problem+json")
            problem = response.json()
            return Outcome(messages=[problem["detail"]], code=problem["code"], status=response.status_code)
        return Outcome(row=_row(object_type, since), status=response.status_code)

    return _isolated(run)


def same_as(reference: Outcome, outcome: Outcome, path: str) -> None:
    """``outcome`` (a path's) agrees with ``reference`` (the service's)."""
    if reference.refused:
        assert outcome.refused, f"{path} accepted what the service refuses: {reference.messages}"
        assert reference.messages[0] in outcome.messages or any(
            reference.messages[0] in shown for shown in outcome.messages
        ), f"{path} said {outcome.messages!r}, the service {reference.messages!r}"
        if outcome.code is not None:
            assert outcome.code == reference.code, path
    else:
        assert not outcome.refused, f"{path} refused what the service accepts: {outcome.messages}"
        mine, theirs = outcome.row or {}, reference.row or {}
        differing = {
            k: (mine["after"].get(k), theirs["after"].get(k))
            for k in set(mine["after"]) | set(theirs["after"])
            if mine["after"].get(k) != theirs["after"].get(k)
        }
        assert not differing, f"{path} wrote {differing} (path, service)"
        assert {**mine, "actor_kind": None} == {**theirs, "actor_kind": None}, path


@pytest.fixture
def root(db: Any) -> Client:
    return client_for(User.objects.create_superuser("root", password="x" * 12))


# --- Providers ---------------------------------------------------------------------------------------

LONG = "s" * 70
PROVIDER_CASES = [
    pytest.param({"base_url": "http://127.0.0.1:9/api"}, True, id="good"),
    pytest.param({"base_url": "ftp://127.0.0.1:9/api"}, False, id="bad-url-scheme"),
    pytest.param({"base_url": "http://127.0.0.1:8/api"}, False, id="disallowed-destination"),
    pytest.param(
        {"base_url": "http://127.0.0.1:9/api", "auth_secret_env": "ONCEGUARD_SECRET_GLOBEX_KEY"},
        False,
        id="secret-outside-tenant-namespace",
    ),
    pytest.param({"base_url": "http://127.0.0.1:9/api", "slug": LONG}, False, id="over-long-slug"),
    pytest.param({"base_url": "http://127.0.0.1:9/api", "slug": "not a slug"}, False, id="bad-slug"),
    pytest.param({"base_url": "http://127.0.0.1:9/api", "slug": "_mine"}, False, id="reserved-slug"),
    pytest.param(
        {"base_url": "http://127.0.0.1:9/api", "request_template": {"method": "POST", "body": "{{ __import__ }}"}},
        False,
        id="template-that-evaluates",
    ),
]


@pytest.mark.parametrize(("given", "accepted"), PROVIDER_CASES)
def test_a_provider_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(
    tenant, other_tenant, root, tmp_path, given, accepted
):
    slug = given.get("slug", "crm")
    extra = {k: v for k, v in given.items() if k not in ("slug", "base_url")}
    reference = by_service(
        "ledger.provider",
        lambda: services.provider_upsert(
            tenant=tenant, slug=slug, base_url=given["base_url"], idempotency_class="key_enforced", **extra
        ),
    )
    assert reference.refused is not accepted, reference.messages

    args = [
        "provider_upsert",
        "--tenant=acme",
        f"--slug={slug}",
        f"--base-url={given['base_url']}",
        "--class=key_enforced",
    ]
    if "auth_secret_env" in given:
        args.append(f"--auth-secret-env={given['auth_secret_env']}")
    if "request_template" in given:
        path = tmp_path / "template.json"
        path.write_text(json.dumps(given["request_template"]))
        args.append(f"--request-template-file={path}")
    same_as(reference, by_command("ledger.provider", *args), "command")

    form = {"tenant": str(tenant.pk), "slug": slug, "base_url": given["base_url"], "idempotency_class": "key_enforced"}
    if "auth_secret_env" in given:
        form["auth_secret_env"] = given["auth_secret_env"]
    if "request_template" in given:
        form["request_template"] = json.dumps(given["request_template"])
    same_as(reference, by_console(root, "ledger.provider", "/admin/ledger/provider/add/", **form), "console")


INTENT_SCHEMA = {"fields": {"preset_id": {"type": "enum", "values": ["studio", "outdoor"], "required": True}}}
INTENT_CASES = [
    pytest.param({"method": "POST", "path": "/v1/{{ preset_id }}"}, True, id="good"),
    pytest.param({"method": "POST", "path": "/v1/{{ preset_id.__class__ }}"}, False, id="template-that-evaluates"),
    pytest.param({"method": "POST", "path": "/v1/{{ nowhere }}"}, False, id="template-names-no-field"),
    pytest.param(["not", "an", "object"], False, id="template-not-an-object"),
]


@pytest.mark.parametrize(("template", "accepted"), INTENT_CASES)
def test_a_providers_intent_is_refused_and_accepted_alike_by_the_console_the_command_and_the_api(
    tenant, root, make_client, tmp_path, template, accepted
):
    provider = services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    reference = by_service(
        "ledger.provider",
        lambda: services.provider_upsert(
            tenant=tenant, slug="crm", intent_schema=INTENT_SCHEMA, request_template=template, reason="v2"
        ),
    )
    assert reference.refused is not accepted, reference.messages

    schema_file, template_file = tmp_path / "schema.json", tmp_path / "template.json"
    schema_file.write_text(json.dumps(INTENT_SCHEMA))
    template_file.write_text(json.dumps(template))
    command = by_command(
        "ledger.provider",
        "provider_upsert",
        "--tenant=acme",
        "--slug=crm",
        "--base-url=http://127.0.0.1:9",
        "--class=key_enforced",
        f"--intent-schema-file={schema_file}",
        f"--request-template-file={template_file}",
        "--reason=v2",
    )
    same_as(reference, command, "command")
    admin = make_client(tenant, ["admin"])
    api = by_api(
        admin,
        "ledger.provider",
        "put",
        "/api/v1/providers/crm/intent",
        {"intent_schema": INTENT_SCHEMA, "request_template": template, "reason": "v2"},
    )
    same_as(reference, api, "API")
    console = by_console(
        root,
        "ledger.provider",
        f"/admin/ledger/provider/{provider.pk}/change/",
        intent_schema=json.dumps(INTENT_SCHEMA),
        request_template=json.dumps(template),
        change_reason="v2",
    )
    same_as(reference, console, "console")


# --- Replay targets ----------------------------------------------------------------------------------

TARGET_CASES = [
    pytest.param({"url": "http://127.0.0.1:9/hook"}, True, id="good"),
    pytest.param({"url": "ftp://127.0.0.1:9/hook"}, False, id="bad-url-scheme"),
    pytest.param({"url": "http://127.0.0.1:8/hook"}, False, id="disallowed-destination"),
    pytest.param({"url": "http://93.184.215.14/hook"}, False, id="plain-http-off-this-machine"),
    pytest.param(
        {"url": "http://127.0.0.1:9/hook", "lookup_url": "http://127.0.0.1:9/find"}, False, id="lookup-no-key"
    ),
    pytest.param({"url": "http://127.0.0.1:9/hook", "slug": "t" * 70}, False, id="over-long-slug"),
    pytest.param({"url": "http://127.0.0.1:9/hook", "idempotency_header": "H" * 101}, False, id="over-long-header"),
]


@pytest.mark.parametrize(("given", "accepted"), TARGET_CASES)
def test_a_replay_target_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(
    tenant, root, given, accepted
):
    slug = given.get("slug", "crm")
    extra = {k: v for k, v in given.items() if k in ("lookup_url", "idempotency_header")}
    reference = by_service(
        "dlq.replaytarget",
        lambda: replay_target_upsert(
            tenant=tenant, slug=slug, url=given["url"], idempotency_class="key_enforced", **extra
        ),
    )
    assert reference.refused is not accepted, reference.messages

    args = ["replaytarget_upsert", "--tenant=acme", f"--slug={slug}", f"--url={given['url']}"]
    args.append("--idempotency-class=key_enforced")
    args += [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
    same_as(reference, by_command("dlq.replaytarget", *args), "command")

    form = {"tenant": str(tenant.pk), "slug": slug, "url": given["url"], "idempotency_class": "key_enforced", **extra}
    same_as(reference, by_console(root, "dlq.replaytarget", "/admin/dlq/replaytarget/add/", **form), "console")


# --- n8n connections ---------------------------------------------------------------------------------

N8N_CASES = [
    pytest.param({"url": "http://127.0.0.1:9", "key": "n8n_api_good"}, True, id="good"),
    pytest.param({"url": "ftp://127.0.0.1:9", "key": "n8n_api_good"}, False, id="bad-url-scheme"),
    pytest.param({"url": "http://127.0.0.1:8", "key": "n8n_api_good"}, False, id="disallowed-destination"),
    pytest.param({"url": "http://127.0.0.1:9/?token=x", "key": "n8n_api_good"}, False, id="url-with-query"),
    pytest.param({"url": "http://127.0.0.1:9", "key": "n8n_api_good", "timeout": 60.0}, False, id="timeout-too-long"),
    pytest.param({"url": "http://127.0.0.1:9", "key": "two words"}, False, id="key-with-a-space"),
]


@pytest.mark.parametrize(("given", "accepted"), N8N_CASES)
def test_an_n8n_connection_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(
    tenant, root, given, accepted
):
    timeout = given.get("timeout", 5.0)
    reference = by_service(
        "dlq.n8nconnection",
        lambda: n8n_connection_save(
            tenant=tenant, base_url=given["url"], api_key=given["key"], timeout_seconds=timeout, actor="user:x"
        ),
    )
    assert reference.refused is not accepted, reference.messages
    command = by_command(
        "dlq.n8nconnection",
        "n8n_connect",
        "--tenant=acme",
        f"--url={given['url']}",
        f"--timeout-seconds={timeout}",
        stdin=given["key"] + "\n",
    )
    same_as(reference, command, "command")
    console = by_console(
        root,
        "dlq.n8nconnection",
        "/admin/dlq/n8nconnection/add/",
        tenant=str(tenant.pk),
        base_url=given["url"],
        new_api_key=given["key"],
        timeout_seconds=str(timeout),
    )
    same_as(reference, console, "console")


# --- Alert channels ----------------------------------------------------------------------------------

CHANNEL_CASES = [
    pytest.param({"url": "http://127.0.0.1:9/hook"}, True, id="good"),
    pytest.param({"url": "ftp://127.0.0.1:9/hook"}, False, id="bad-url-scheme"),
    pytest.param({"url": "http://127.0.0.1:8/hook"}, False, id="disallowed-destination"),
    pytest.param({"url": "http://127.0.0.1:9/hook", "name": "n" * 70}, False, id="over-long-name"),
    pytest.param({"url": "http://127.0.0.1:9/hook", "name": "not a slug"}, False, id="bad-name"),
]


@pytest.mark.parametrize(("given", "accepted"), CHANNEL_CASES)
def test_an_alert_channel_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(
    tenant, root, given, accepted
):
    name = given.get("name", "ops")
    reference = by_service(
        "alerts.alertchannel",
        lambda: alert_channel_upsert(tenant=tenant, name=name, kind="slack", url=given["url"]),
    )
    assert reference.refused is not accepted, reference.messages
    command = by_command(
        "alerts.alertchannel",
        "alertchannel_upsert",
        "--tenant=acme",
        f"--name={name}",
        "--kind=slack",
        f"--url={given['url']}",
    )
    same_as(reference, command, "command")
    console = by_console(
        root,
        "alerts.alertchannel",
        "/admin/alerts/alertchannel/add/",
        tenant=str(tenant.pk),
        name=name,
        kind="slack",
        webhook_url=given["url"],
    )
    same_as(reference, console, "console")


# --- Tenants -----------------------------------------------------------------------------------------

TENANT_CASES = [
    pytest.param({"slug": "initech"}, True, id="good"),
    pytest.param({"slug": "t" * 70}, False, id="over-long-slug"),
    pytest.param({"slug": "not a slug"}, False, id="bad-slug"),
    pytest.param({"slug": "initech", "name": "n" * 201}, False, id="over-long-name"),
]


@pytest.mark.parametrize(("given", "accepted"), TENANT_CASES)
def test_a_tenant_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(root, given, accepted):
    name = given.get("name", "Initech")
    reference = by_service("ledger.tenant", lambda: services.tenant_create(slug=given["slug"], name=name))
    assert reference.refused is not accepted, reference.messages
    same_as(reference, by_command("ledger.tenant", "tenant_create", given["slug"], f"--name={name}"), "command")
    console = by_console(root, "ledger.tenant", "/admin/ledger/tenant/add/", slug=given["slug"], name=name)
    same_as(reference, console, "console")


ALLOW_CASES = [
    pytest.param("http://127.0.0.1:9/cb", True, id="good"),
    pytest.param("ftp://127.0.0.1:9/cb", False, id="bad-url-scheme"),
    pytest.param("http://127.0.0.1:8/cb", False, id="disallowed-destination"),
]


@pytest.mark.parametrize(("prefix", "accepted"), ALLOW_CASES)
def test_a_tenants_callback_allow_list_is_refused_and_accepted_alike_by_the_console_the_command_and_the_service(
    tenant, root, prefix, accepted
):
    # Made beforehand: the command would otherwise make it too (a second row of its own).
    callbacks.tenant_callback_secret(tenant_id=tenant.pk, actor="user:x")
    reference = by_service(
        "ledger.tenant",
        lambda: services.tenant_update(tenant_id=tenant.pk, actor="user:x", callback_allow_list=[prefix]),
    )
    assert reference.refused is not accepted, reference.messages
    command = by_command("ledger.tenant", "tenant_callback_secret", "--tenant=acme", f"--allow={prefix}")
    same_as(reference, command, "command")
    console = by_console(
        root, "ledger.tenant", f"/admin/ledger/tenant/{tenant.pk}/change/", callback_allow_list=json.dumps([prefix])
    )
    same_as(reference, console, "console")


# --- Prompt templates --------------------------------------------------------------------------------

PROMPT_CASES = [
    pytest.param({"name": "product-shot", "text": "Draw {{ item }}."}, True, id="good"),
    pytest.param({"name": "Product Shot", "text": "Draw {{ item }}."}, False, id="bad-name"),
    pytest.param({"name": "p" * 70, "text": "Draw {{ item }}."}, False, id="over-long-name"),
    pytest.param({"name": "product-shot", "text": "Draw {{ item.__class__ }}."}, False, id="text-that-evaluates"),
    pytest.param({"name": "product-shot", "text": "Draw {{ other }}."}, False, id="undeclared-slot"),
]


@pytest.mark.parametrize(("given", "accepted"), PROMPT_CASES)
def test_a_prompt_template_is_refused_and_accepted_alike_by_the_console_the_command_and_the_api(
    tenant, root, make_client, tmp_path, given, accepted
):
    slots = {"item": {"max_length": 200}}
    reference = by_service(
        "ledger.prompttemplate",
        lambda: prompts.prompt_template_create(
            tenant=tenant, name=given["name"], text=given["text"], slots=slots, actor="user:x"
        ),
    )
    assert reference.refused is not accepted, reference.messages
    text_file = tmp_path / "prompt.txt"
    text_file.write_text(given["text"])
    command = by_command(
        "ledger.prompttemplate",
        "prompt_template",
        "create",
        "--tenant=acme",
        f"--name={given['name']}",
        f"--text-file={text_file}",
        "--slot=item=200",
    )
    same_as(reference, command, "command")
    api = by_api(
        make_client(tenant, ["admin"]),
        "ledger.prompttemplate",
        "post",
        "/api/v1/prompt-templates",
        {"name": given["name"], "text": given["text"], "slots": slots},
    )
    same_as(reference, api, "API")
    console = by_console(
        root,
        "ledger.prompttemplate",
        "/admin/ledger/prompttemplate/add/",
        tenant=str(tenant.pk),
        name=given["name"],
        text=given["text"],
        slots=json.dumps(slots),
    )
    same_as(reference, console, "console")


# --- Retention policies (console and service; no command or API sets one) ------------------------------

RETENTION_CASES = [
    pytest.param(("operations", "7 days", "30 days", timedelta(days=7), timedelta(days=30)), True, id="good"),
    pytest.param(
        ("operations", "60 days", "30 days", timedelta(days=60), timedelta(days=30)), False, id="payload-after-record"
    ),
    pytest.param(("access_log", "", "1 day", None, timedelta(days=1)), False, id="access-log-below-floor"),
]


@pytest.mark.parametrize(("given", "accepted"), RETENTION_CASES)
def test_a_retention_policy_is_refused_and_accepted_alike_by_the_console_and_the_service(tenant, root, given, accepted):
    record_type, payload_words, record_words, payload_ttl, record_ttl = given
    reference = by_service(
        "review.retentionpolicy",
        lambda: retention_policy_save(
            tenant_id=tenant.pk,
            record_type=record_type,
            payload_ttl=payload_ttl,
            record_ttl=record_ttl,
            actor="user:x",
        ),
    )
    assert reference.refused is not accepted, reference.messages
    console = by_console(
        root,
        "review.retentionpolicy",
        "/admin/review/retentionpolicy/add/",
        tenant=str(tenant.pk),
        record_type=record_type,
        payload_ttl=payload_words,
        record_ttl=record_words,
    )
    same_as(reference, console, "console")


def test_the_console_trail_row_is_the_services_and_written_once(tenant, root):
    """A console save through a service writes exactly one row (not the service's and the
    console mixin's both), with the user as actor."""
    services.provider_upsert(tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced")
    since = _last_change_id()
    provider_id = services.provider_for(tenant=tenant, slug="crm").pk
    response = submit_form(root, f"/admin/ledger/provider/{provider_id}/change/", max_attempts="9")
    assert response.status_code == 302
    rows = list(ConfigChange.objects.filter(pk__gt=since))
    assert [(r.object_type, r.actor, r.after) for r in rows] == [("ledger.provider", "user:root", {"max_attempts": 9})]
    assert Tenant.objects.count() == 1


def test_a_provider_resume_writes_the_same_trail_row_from_the_console_and_the_command(tenant, root):
    provider = services.provider_upsert(
        tenant=tenant, slug="crm", base_url="http://127.0.0.1:9", idempotency_class="key_enforced"
    )
    services.provider_pause(provider_id=provider.pk, reason="401 from the provider", actor="worker")
    reference = by_service("ledger.provider", lambda: services.provider_resume(provider_id=provider.pk, actor="user:x"))
    assert reference.row is not None and reference.row["after"]["paused_at"] is None
    same_as(reference, by_command("ledger.provider", "provider_resume", "--tenant=acme", "--slug=crm"), "command")

    def console() -> Outcome:
        since = _last_change_id()
        response = root.post(
            "/admin/review/pausedprovider/", {"action": "resume", "_selected_action": [provider.pk], "index": 0}
        )
        assert response.status_code == 302
        return Outcome(row=_row("ledger.provider", since))

    same_as(reference, _isolated(console), "console")
