"""The console under hostile input: every list linked from the console (found from the admin
site's registry and its history pages, not a hand list) with hostile query strings, and every
add and change form with hostile values, as a superuser and as each role of review.staff.roles
(tenant-scoped): no response is a 5xx, and a lookup a list does not offer is a 400 page —
never a list filtered by it (ledger.web.console_base).

The walk as every role is heavy (the PostgreSQL pass); a superuser's smaller walk runs on both
databases. Each walk prints how many requests it made."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import models
from django.test import Client
from django.urls import NoReverseMatch, reverse

from alerts.services import alert_channel_upsert, alert_raise
from dlq.models import N8nConnection
from dlq.targets.services import replay_target_upsert
from ledger.models import Tenant
from ledger.protocol import services
from ledger.providers import prompts
from review.retention.policies import retention_policy_save
from review.staff.roles import ROLES
from tests.console.support import (
    FormValues,
    advisory_provider,
    enforced_provider,
    failed_op,
    op_in_review,
    staff,
    succeeded_op,
)

pytestmark = pytest.mark.django_db

DEEP_JSON = "[" * 40 + "]" * 40
HUGE_INT = "9" * 100
# Values a form field must refuse (or store harmlessly), never answer with a 500.
HOSTILE_VALUES = (
    "NaN",
    "1e309",
    "-Infinity",
    HUGE_INT,
    DEEP_JSON,
    '{"a": NaN, "b": 1e309}',
    "a\x00b",
    "x" * 10_000,
)
# The few a walk as each role sends to every field one at a time (the rest go all at once).
PER_FIELD_VALUES = ("NaN", HUGE_INT, DEEP_JSON)


@dataclass
class Walk:
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)

    def get(self, client: Client, url: str) -> int:
        self.requests += 1
        response = client.get(url)
        if response.status_code >= 500:
            self.failures.append(f"GET {url[:200]} → {response.status_code}")
        return response.status_code

    def post(self, client: Client, url: str, data: dict[str, Any]) -> int:
        self.requests += 1
        response = client.post(url, data)
        if response.status_code >= 500:
            shown = {k: (v[:20] if isinstance(v, str) else v) for k, v in data.items() if k != "csrfmiddlewaretoken"}
            self.failures.append(f"POST {url} {shown} → {response.status_code}")
        return response.status_code


def _seed(tenant: Tenant, tag: str) -> None:
    """A few rows of every kind the console lists."""
    mailer = advisory_provider(tenant)
    crm = enforced_provider(tenant)
    replay_target_upsert(tenant=tenant, slug="hook", url="http://127.0.0.1:9/hook", is_default=True)
    op_in_review(tenant, mailer, f"{tag}:review")
    failed_op(tenant, crm, f"{tag}:failed")
    succeeded_op(tenant, crm, f"=cmd|{tag}")
    services.apikey_create(tenant=tenant, scopes=["read"], name=f"{tag}-key")
    alert_channel_upsert(tenant=tenant, name="ops", kind="webhook", url="http://127.0.0.1:9/alerts")
    alert_raise(tenant_id=tenant.pk, kind="dlq_new", ref="1", summary="a failure")
    retention_policy_save(tenant_id=tenant.pk, record_type="operations", actor="test")
    prompts.prompt_template_create(
        tenant=tenant, name="greet", text="Hello {{ who }}", slots={"who": {"max_length": 20}}, actor="test"
    )
    N8nConnection.objects.create(tenant=tenant, base_url="http://127.0.0.1:9")


@pytest.fixture
def seeded(tenant: Tenant, other_tenant: Tenant) -> None:
    _seed(tenant, "own")
    _seed(other_tenant, "other")


def _changelists() -> Iterator[tuple[type[models.Model], Any, str]]:
    """(model, its page, its list's address) for every list of the console's site."""
    for model, model_admin in admin.site._registry.items():
        try:
            url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        except NoReverseMatch:
            continue
        yield model, model_admin, url
    for model, page in admin.site._history_pages.items():
        yield model, page, reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def _unoffered_lookups(model: type[models.Model]) -> list[str]:
    """Lookups no console list offers: a regex, an unknown field, the model's secret-looking and
    JSON columns, a year out of range."""
    fields = [f for f in model._meta.concrete_fields]
    secretish = [f.name for f in fields if any(w in f.name for w in ("secret", "token", "hash", "password"))]
    jsonish = [f.name for f in fields if isinstance(f, models.JSONField)]
    dated = [f.name for f in fields if isinstance(f, models.DateTimeField)]
    text = [f.name for f in fields if isinstance(f, (models.CharField, models.TextField))]
    out = ["no_such_field__exact=1", "pk__regex=(", "id__in=a,b"]
    out += [f"{name}__startswith=a" for name in secretish[:2]]
    out += [f"{name}__contains=a" for name in jsonish[:1]]
    out += [f"{name}__iso_year=0" for name in dated[:1]]
    out += [f"{name}__regex=(" for name in text[:1]]
    return out


# Not lookups: Django's own list parameters and the search box, with values nobody types.
ODD_PARAMETERS = (
    "q=" + "a" * 10_000,
    "q=%00",
    "p=abc",
    "p=99999999999999999999",
    "p=-1",
    "o=999",
    "o=abc.-.--7",
    "created_at__gte=99999-01-01",
    "at__year=99999",
    "all=&_popup=1",
)


def walk_lists(client: Client, walk: Walk, *, odd: tuple[str, ...], lookups: int, exports: bool) -> None:
    for model, _page, url in _changelists():
        if walk.get(client, url) != 200:
            continue  # not this user's page (403, or a redirect): nothing more to try there
        for query in odd:
            walk.get(client, f"{url}?{query}")
        for query in _unoffered_lookups(model)[:lookups]:
            for address in (f"{url}?{query}", f"{url}export.csv?{query}")[: 2 if exports else 1]:
                status = walk.get(client, address)
                if status not in (400, 403):
                    walk.filtered.append(f"{address} → {status}")


def _forms(*, only_json: bool) -> Iterator[str]:
    """Every add and change form of the console's site (a change form: its first row); with
    ``only_json``, those of models with a JSON column a person edits."""
    for model, _model_admin in admin.site._registry.items():
        if only_json and not any(isinstance(f, models.JSONField) and f.editable for f in model._meta.fields):
            continue
        info = model._meta.app_label, model._meta.model_name
        try:
            yield reverse("admin:{}_{}_add".format(*info))
        except NoReverseMatch:
            pass
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            try:
                yield reverse("admin:{}_{}_change".format(*info), args=[first.pk])
            except NoReverseMatch:
                continue


def _form_data(client: Client, walk: Walk, url: str) -> dict[str, Any] | None:
    walk.requests += 1
    response = client.get(url)
    if response.status_code >= 500:
        walk.failures.append(f"GET {url} → {response.status_code}")
    if response.status_code != 200:
        return None
    parser = FormValues()
    parser.feed(response.content.decode())
    data = {k: v for k, v in parser.values.items() if k not in ("_addanother", "_continue", "_save", "q")}
    data["_save"] = "Save"
    return data


def _typed(data: dict[str, Any]) -> list[str]:
    """The fields a person types into (not the form's machinery, not inline management)."""
    return [
        k
        for k, v in data.items()
        if isinstance(v, str) and k not in ("csrfmiddlewaretoken", "_save") and "-TOTAL_FORMS" not in k
        if "-INITIAL_FORMS" not in k and "-MIN_NUM_FORMS" not in k and "-MAX_NUM_FORMS" not in k
    ]


def _numberish(value: str) -> bool:
    # JSON boxes and number boxes: where a value Python parses but nothing stores slips through.
    return value[:1] in ("[", "{") or value.lstrip("-").replace(".", "", 1).isdigit()


def walk_forms(
    client: Client, walk: Walk, *, values: tuple[str, ...], per_field: bool = False, only_json: bool = False
) -> None:
    for url in _forms(only_json=only_json):
        data = _form_data(client, walk, url)
        if data is None:
            continue
        typed = _typed(data)
        for value in values:
            walk.post(client, url, {**data, **dict.fromkeys(typed, value)})
        if per_field:
            # One field at a time, the rest as the page gave them: the form gets past its other
            # checks to the model's and the service's.
            for name in [n for n in typed if _numberish(data[n])]:
                for value in PER_FIELD_VALUES:
                    walk.post(client, url, {**data, name: value})


def _client(user: User) -> Client:
    # Answers, not exceptions: a 500 is counted with the others, not the end of the walk.
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _report(who: str, walk: Walk) -> None:
    print(f"console fuzz as {who}: {walk.requests} requests, {len(walk.failures)} answered ≥ 500")
    assert not walk.failures, "\n".join(walk.failures[:30])
    assert not walk.filtered, "lookups answered with a list:\n" + "\n".join(walk.filtered[:30])


def test_a_superuser_walking_every_list_and_the_json_forms_with_hostile_input_gets_no_5xx(seeded):
    """The part that runs on both databases: every list with a few odd parameters and an
    unoffered lookup, the forms of models with JSON columns with the values JSON cannot hold."""
    root = User.objects.create_superuser("root", password="correct horse battery")
    walk = Walk()
    client = _client(root)
    walk_lists(client, walk, odd=(ODD_PARAMETERS[0], ODD_PARAMETERS[7]), lookups=1, exports=False)
    walk_forms(client, walk, values=('{"a": NaN, "b": 1e309}', DEEP_JSON), only_json=True)
    _report("superuser (subset)", walk)


@pytest.mark.heavy
@pytest.mark.parametrize("role", ["superuser", *ROLES])
def test_every_role_walking_every_list_and_form_with_hostile_input_gets_no_5xx(seeded, tenant, role):
    root = User.objects.create_superuser("root", password="correct horse battery")
    user = root if role == "superuser" else staff(f"fuzz-{role}", role=role, tenants=[tenant])
    walk = Walk()
    client = _client(user)
    # Which lookups a list offers does not depend on the role (only which rows it shows): the
    # superuser tries them on the lists and their exports, each role on its lists; the odd
    # parameters are shared between them.
    if role == "superuser":
        walk_lists(client, walk, odd=ODD_PARAMETERS[:4], lookups=3, exports=True)
    else:
        walk_lists(client, walk, odd=ODD_PARAMETERS[4:], lookups=2, exports=False)
    # Every form with each hostile value in every field at once; the superuser's (every form)
    # also one JSON or number field at a time.
    walk_forms(
        client,
        walk,
        values=HOSTILE_VALUES[1::2] if role == "superuser" else HOSTILE_VALUES,
        per_field=role == "superuser",
    )
    _report(role, walk)


def test_the_fuzz_walk_finds_every_list_of_the_console():
    """The walk reads the site's registry: a page registered tomorrow is walked tomorrow."""
    urls = {url for _, _, url in _changelists()}
    assert {"/admin/ledger/operation/", "/admin/ledger/attempt/", "/admin/dlq/failedevent/"} <= urls
    assert len(urls) >= 25
