"""Console forms answer a form error, never a 5xx, for numbers JSON or the database cannot hold
(NaN, ±Infinity, 1e309, 100-digit integers), JSON nested past the limit, and a prompt-template
name the service refuses (ledger.web.console_base.ConsoleJSONField, PromptTemplateForm)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.models import PromptTemplate, Provider
from ledger.web.console_base import MAX_FORM_JSON_DEPTH, ConsoleJSONField
from tests.console.support import enforced_provider, submit_form

pytestmark = pytest.mark.django_db

UNSTORABLE = (
    "NaN",
    "[NaN]",
    "[Infinity]",
    "[-Infinity]",
    "[1e309]",
    "[" + "9" * 100 + "]",
    "[" + "9" * 5000 + "]",
    "[" * (MAX_FORM_JSON_DEPTH + 1) + "]" * (MAX_FORM_JSON_DEPTH + 1),
    "[" * 5000 + "]" * 5000,
    '["a\\u0000b"]',
)


@pytest.fixture
def root() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", password="correct horse battery"))
    return client


@pytest.mark.parametrize("text", UNSTORABLE)
def test_json_a_console_form_cannot_store_is_a_form_error(text):
    field = ConsoleJSONField(required=False)
    with pytest.raises(Exception) as caught:
        field.clean(text)
    assert type(caught.value).__name__ == "ValidationError"
    # Shown back as typed on the page with the error, never re-parsed into a crash.
    assert str(field.bound_data(text, None)) == text


def test_json_within_the_limits_is_still_taken():
    field = ConsoleJSONField(required=False)
    nested = "[" * MAX_FORM_JSON_DEPTH + "]" * MAX_FORM_JSON_DEPTH
    assert field.clean('{"a": [1, 2.5, "x", null, true], "n": 9223372036854775807}')["n"] == 2**63 - 1
    assert field.clean(nested) is not None


@pytest.mark.parametrize("text", ["[NaN]", "[1e309]", "[" + "9" * 100 + "]", "[" * 40 + "]" * 40])
def test_a_provider_form_with_json_it_cannot_store_answers_a_form_error(tenant, root, text):
    provider = enforced_provider(tenant)
    before = Provider.objects.filter(pk=provider.pk).values("success_values").get()
    response = submit_form(root, f"/admin/ledger/provider/{provider.pk}/change/", success_values=text)
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()
    assert Provider.objects.filter(pk=provider.pk).values("success_values").get() == before


def test_an_invalid_prompt_template_name_is_a_form_error(tenant, root):
    response = root.post(
        "/admin/ledger/prompttemplate/add/",
        {"tenant": tenant.pk, "name": "Greeting", "text": "Hello {{ who }}", "slots": '{"who": {"max_length": 5}}'},
    )
    assert response.status_code == 200
    assert "lower case letters" in response.content.decode()
    assert not PromptTemplate.objects.exists()
