"""The OpenAPI schema generates cleanly and the docs page works offline."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client


def test_openapi_schema_generates_without_warnings(tmp_path):
    # --fail-on-warn turns any unresolved view, serializer or authenticator into an error.
    call_command("spectacular", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    text = (tmp_path / "schema.yml").read_text()
    assert "/api/v1/claims:" in text
    # The Bearer API key is documented as the security scheme of every endpoint.
    assert "ApiKey:" in text and "scheme: bearer" in text


@pytest.mark.django_db
def test_docs_page_serves_swagger_from_our_own_static_files():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr" not in html and "unpkg.com" not in html


@pytest.mark.django_db
def test_schema_endpoint_answers_without_authentication():
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/operations/{operation_id}/complete" in response.content
