"""A provider's lookup and status paths are tenant-written: their placeholders are filled by a
plain substitution, never evaluated (DESIGN §5: credentials and paths a tenant cannot aim).
``str.format`` would run attribute access (``{provider_ref.__class__}``), indexing and format
specs (``{provider_ref:>2000000000}`` asks for gigabytes on save and at every poll)."""

from __future__ import annotations

import pytest

from ledger.execution.polling import status_url
from ledger.models import IdempotencyClass, Operation
from ledger.platform.errors import ValidationFailed
from ledger.protocol.services import provider_upsert
from ledger.providers.reconcile import lookup_url
from ledger.rules.provider_checks import lookup_path_problem, path_fill, poll_path_problem

ASYNC = dict(
    base_url="http://127.0.0.1:9",
    idempotency_class=IdempotencyClass.KEY_ENFORCED,
    ref_pointer="/id",
    poll_status_pointer="/status",
    poll_succeeded_values=["succeeded"],
    poll_failed_values=["failed"],
    poll_initial_seconds=0.5,
    poll_max_seconds=4.0,
)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/renders/{provider_ref}/{provider_ref.__class__.__name__}",
        "/v1/renders/{provider_ref}/{provider_ref:>50}",
        "/v1/renders/{provider_ref}{provider_ref!r}",
        "/v1/renders/{provider_ref}/{provider_ref[0]}",
        "/v1/renders/{provider_ref}/{{literal}}",
        "/v1/renders/{provider_ref}/{}",
        "/v1/renders/{provider_ref}}",
    ],
)
def test_a_status_path_with_anything_but_the_plain_placeholder_is_refused_on_save(tenant, path):
    assert poll_path_problem(path) is not None
    with pytest.raises(ValidationFailed, match="poll_path"):
        provider_upsert(tenant=tenant, slug="renders", poll_path=path, **ASYNC)


@pytest.mark.parametrize(
    "path", ["/charges?k={key.__class__}", "/charges?k={key:>99}", "/charges/{key[0]}", "/c/{reconciliation_handle!s}"]
)
def test_a_lookup_path_with_anything_but_the_plain_placeholders_is_refused_on_save(tenant, path):
    assert lookup_path_problem(path) is not None
    with pytest.raises(ValidationFailed, match="lookup path may use only"):
        provider_upsert(
            tenant=tenant,
            slug="charges",
            base_url="http://127.0.0.1:9",
            idempotency_class=IdempotencyClass.KEY_ENFORCED,
            lookup_path=path,
        )


def test_placeholders_are_substituted_once_and_a_value_is_never_read_as_one(tenant):
    assert path_fill("/v1/{provider_ref}/x", {"provider_ref": "{provider_ref}"}) == "/v1/{provider_ref}/x"
    provider = provider_upsert(
        tenant=tenant,
        slug="renders",
        poll_path="/v1/renders/{provider_ref}",
        lookup_path="/v1/renders?key={key}&h={reconciliation_handle}",
        **ASYNC,
    )
    op = Operation(tenant=tenant, provider=provider, key="a/b {key}", provider_ref="job/{x}", reconciliation_handle="")
    assert status_url(provider, op) == "http://127.0.0.1:9/v1/renders/job%2F%7Bx%7D"
    assert lookup_url(provider, op) == "http://127.0.0.1:9/v1/renders?key=a%2Fb%20%7Bkey%7D&h="


def test_a_path_stored_before_the_check_is_not_evaluated_at_send_time(tenant):
    provider = provider_upsert(tenant=tenant, slug="renders", poll_path="/v1/renders/{provider_ref}", **ASYNC)
    provider.poll_path = "/v1/{provider_ref}/{provider_ref.__class__}"
    op = Operation(tenant=tenant, provider=provider, key="k", provider_ref="job")
    with pytest.raises(ValueError):
        status_url(provider, op)


@pytest.mark.parametrize(
    "path", ["/v1/renders/\t{provider_ref}", "/v1/renders/{provider_ref} x", "/v1/\x00/{provider_ref}"]
)
def test_a_status_path_with_blanks_or_control_characters_is_refused_on_save(tenant, path):
    # httpx would refuse to build its URL at every poll.
    with pytest.raises(ValidationFailed, match="poll_path"):
        provider_upsert(tenant=tenant, slug="renders", poll_path=path, **ASYNC)
