"""A tenant's secret namespace is fixed and unique (ADR 0001).

The attack it closes: a provider's credential may come from an environment variable of its
tenant's set, and that set used to be named after the tenant's slug — which a tenant's console
admin could change (renamed to another tenant's slug, it read that tenant's secrets), and
which let ``acme`` read ``ONCEGUARD_SECRET_ACME_X_…``, the variables of ``acme-x``. Each test
plays a step of it; where a secret could leave, a loopback listener records every connection
and the secret must never arrive."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from ledger.execution.submission import operation_submit
from ledger.models import ConfigChange, IdempotencyClass, Operation, OperationStatus, Provider, Tenant
from ledger.platform.errors import ValidationFailed
from ledger.protocol import services
from tests.conftest import on_postgres
from tests.console.support import client_for, page, staff, submit_form
from tests.execute.support import run_due
from tests.support.listener import Listener

S = OperationStatus
ACME_SECRET = "sk_live_acme_own_0001"
ACME_X_SECRET = "sk_live_acme_x_only_0002"
ACME_X_LEGACY_SECRET = "sk_live_acme_x_legacy_0003"
GLOBEX_SECRET = "sk_live_globex_only_0004"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener(allow=True)
    yield server
    server.close()


@pytest.fixture
def acme_x(db: object) -> Tenant:
    return services.tenant_create(slug="acme-x")


def _provider(tenant: Tenant, url: str, slug: str = "exfil", **fields: object) -> Provider:
    return services.provider_upsert(
        tenant=tenant,
        slug=slug,
        base_url=url,
        idempotency_class=IdempotencyClass.KEY_ADVISORY,
        auth_header="Authorization",
        timeout_seconds=2,
        max_attempts=1,
        **fields,
    )


def _submit_and_run(tenant: Tenant, key: str, provider: str = "exfil") -> Operation:
    operation_submit(tenant=tenant, key=key, provider=provider, request={"method": "POST", "path": "/c", "body": {}})
    (done,) = run_due()
    return done


def _aimed_by_hand_at(provider: Provider, name: str) -> None:
    # A reference stored past the save checks (before them, or by hand in the database).
    Provider.objects.filter(pk=provider.pk).update(auth_secret_env=name, paused_at=None, paused_reason="")
    services.provider_cache_forget(provider)


# --- The namespace: derived once, fixed, never the slug ------------------------------------------


def test_a_new_tenant_gets_a_namespace_from_its_slug_and_acme_x_gets_one_acme_is_not_a_prefix_of(tenant, acme_x):
    assert tenant.secret_namespace == "ACME"
    assert acme_x.secret_namespace.isalnum() and acme_x.secret_namespace.isupper()
    assert not acme_x.secret_namespace.startswith("ACME")
    beta_dash = services.tenant_create(slug="beta-x")
    beta_under = services.tenant_create(slug="beta_x")
    # Once "-" and "_" are dropped, beta-x and beta_x would share BETAX: the second gets another.
    assert beta_dash.secret_namespace == "BETAX"
    assert beta_under.secret_namespace != "BETAX" and not beta_under.secret_namespace.startswith("BETAX")
    # Deterministic: the same slug among the same namespaces gets the same answer.
    from ledger.rules.provider_checks import secret_namespace_choose

    assert secret_namespace_choose("beta_x", ["BETAX"]) == beta_under.secret_namespace


def test_a_tenant_made_after_a_longer_namespace_gets_a_free_readable_one(db):
    services.tenant_create(slug="acmex")
    assert services.tenant_create(slug="acme").secret_namespace == "ACME2"


def test_the_platform_may_name_the_namespace_at_creation_and_it_is_checked(db):
    out = StringIO()
    call_command("tenant_create", "initech", "--secret-namespace", "INI7", stdout=out)
    assert Tenant.objects.get(slug="initech").secret_namespace == "INI7"
    assert "ONCEGUARD_SECRET_INI7_<NAME>" in out.getvalue()
    for bad in ("INI_X", "ini8", "INI", "INI7X", "X" * 33):
        with pytest.raises(ValidationFailed):
            services.tenant_create(slug=f"t-{len(bad)}-{bad.lower().replace('_', '-')}", secret_namespace=bad)


def test_no_service_changes_a_namespace(tenant):
    with pytest.raises(ValidationFailed):
        services.tenant_update(tenant_id=tenant.pk, actor="cli:x", secret_namespace="EVIL")
    assert Tenant.objects.get(pk=tenant.pk).secret_namespace == "ACME"


def test_tenants_made_in_bulk_get_free_namespaces_too(db):
    made = Tenant.objects.bulk_create([Tenant(slug=f"t-{i}") for i in range(3)] + [Tenant(slug="t0")])
    spaces = [t.secret_namespace for t in made]
    assert spaces[:3] == ["T0", "T1", "T2"] and spaces[3] not in spaces[:3]
    assert sorted(Tenant.objects.values_list("secret_namespace", flat=True)) == sorted(spaces)


# --- The database holds the rule, not only the forms ---------------------------------------------


@pytest.mark.parametrize(
    "namespace",
    [
        "ACME",  # a duplicate (UNIQUE)
        "ACM",  # a prefix of ACME (trigger)
        "ACMEZ",  # ACME is its prefix (trigger)
        "ACME_Z",  # an underscore (CHECK)
        "acmez",  # lower case (CHECK)
        "",  # empty (CHECK)
        "ZED\n",  # a trailing newline a "$" would let through (CHECK)
    ],
)
def test_the_database_refuses_a_duplicate_a_prefix_and_a_malformed_namespace(tenant, namespace):
    if namespace:  # (an empty one on a new tenant means "derive it": save assigns one)
        with pytest.raises(IntegrityError), transaction.atomic():
            Tenant.objects.create(slug="intruder", secret_namespace=namespace)
    other = services.tenant_create(slug="globex")
    with pytest.raises(IntegrityError), transaction.atomic():
        Tenant.objects.filter(pk=other.pk).update(secret_namespace=namespace)
    assert Tenant.objects.get(pk=other.pk).secret_namespace == "GLOBEX"
    # A free one is fine.
    Tenant.objects.create(slug="zed", secret_namespace="ZED")


@pytest.mark.skipif(not on_postgres(), reason="two concurrent transactions: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_creations_of_overlapping_namespaces_do_not_both_commit():
    """Under READ COMMITTED neither insert sees the other's uncommitted row: without the
    trigger's lock, ACME and ACMEX would both commit. The second waits, then is refused."""
    inserted, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                Tenant.objects.create(slug="race-a", secret_namespace="RACE")
                inserted.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def second() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                outcome["pid"] = cursor.fetchone()[0]
            with transaction.atomic():
                Tenant.objects.create(slug="race-b", secret_namespace="RACEX")
            outcome["committed"] = True
        except IntegrityError as error:
            outcome["error"] = error
        finally:
            connection.close()

    a = threading.Thread(target=first)
    a.start()
    assert inserted.wait(timeout=30)
    b = threading.Thread(target=second)
    b.start()
    # Let the first commit only once the second waits for the lock (or has finished: then it
    # did not wait, and the assertion below says so).
    for _ in range(300):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [outcome.get("pid", 0)]
            )
            if cursor.fetchone() or not b.is_alive():
                break
        time.sleep(0.05)
    release.set()
    a.join(timeout=30)
    b.join(timeout=30)
    assert "committed" not in outcome and "error" in outcome
    assert list(Tenant.objects.filter(slug__startswith="race-").values_list("secret_namespace", flat=True)) == ["RACE"]


def test_the_prefix_trigger_is_put_back_after_a_migrate_that_lost_it(tenant):
    """SQLite drops a table's triggers when a migration rebuilds the table: post_migrate
    installs it again (inside the test's transaction: its rollback restores the original)."""
    from ledger.tenants.tenant_namespaces import namespace_triggers_drop, namespace_triggers_ensure

    namespace_triggers_drop(connection)
    with transaction.atomic():
        lost = Tenant.objects.create(slug="lost", secret_namespace="ACMEZ")  # nothing refuses it now
        lost.delete()
    namespace_triggers_ensure(sender=None)
    with pytest.raises(IntegrityError), transaction.atomic():
        Tenant.objects.create(slug="back", secret_namespace="ACMEZ")


# --- Save time and send time use the stored namespace --------------------------------------------


def test_acme_and_acme_x_cannot_reach_each_others_variables_on_save(tenant, acme_x, listener):
    x_space = acme_x.secret_namespace
    for owner, name in (
        (tenant, f"ONCEGUARD_SECRET_{x_space}_STRIPE"),
        (tenant, "ONCEGUARD_SECRET_ACME_X_STRIPE"),  # acme-x's name before namespaces were stored
        (acme_x, "ONCEGUARD_SECRET_ACME_STRIPE"),
        (acme_x, "ONCEGUARD_SECRET_ACME_X_STRIPE"),
    ):
        with pytest.raises(ValidationFailed) as refused:
            _provider(owner, listener.url, auth_secret_env=name)
        # The refusal says exactly which names this tenant may use.
        assert f"ONCEGUARD_SECRET_{owner.secret_namespace}_<NAME>" in refused.value.detail
    _provider(tenant, listener.url, auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE")
    _provider(acme_x, listener.url, auth_secret_env=f"ONCEGUARD_SECRET_{x_space}_STRIPE")


def test_acme_and_acme_x_cannot_reach_each_others_variables_at_send_time(tenant, acme_x, listener, monkeypatch):
    x_space = acme_x.secret_namespace
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_STRIPE", ACME_SECRET)
    monkeypatch.setenv(f"ONCEGUARD_SECRET_{x_space}_STRIPE", ACME_X_SECRET)
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_X_STRIPE", ACME_X_LEGACY_SECRET)
    acme_provider = _provider(tenant, listener.url)
    x_provider = _provider(acme_x, listener.url)
    attempts = [
        (tenant, acme_provider, f"ONCEGUARD_SECRET_{x_space}_STRIPE"),
        (tenant, acme_provider, "ONCEGUARD_SECRET_ACME_X_STRIPE"),
        (acme_x, x_provider, "ONCEGUARD_SECRET_ACME_STRIPE"),
    ]
    for i, (owner, provider, name) in enumerate(attempts):
        _aimed_by_hand_at(provider, name)
        done = _submit_and_run(owner, f"k-{i}")
        assert done.status == S.FAILED and "declared variables" in done.last_error, name
        provider.refresh_from_db()
        assert provider.paused_at is not None and name in provider.paused_reason
    assert listener.connections == 0
    seen = listener.everything()
    assert not any(secret in seen for secret in (ACME_SECRET, ACME_X_SECRET, ACME_X_LEGACY_SECRET))
    # Each one's own variable is read and sent.
    _aimed_by_hand_at(x_provider, f"ONCEGUARD_SECRET_{x_space}_STRIPE")
    assert _submit_and_run(acme_x, "k-own").status == S.SUCCEEDED
    assert listener.seen[-1].headers["Authorization"] == ACME_X_SECRET


def test_a_renamed_tenant_still_reads_only_its_own_namespace(tenant, other_tenant, listener, monkeypatch):
    """The superuser renames acme (a tenant admin no longer can): its variables stay
    ONCEGUARD_SECRET_ACME_…, at save and at send time; the new slug's names and globex's are
    refused."""
    monkeypatch.setenv("ONCEGUARD_SECRET_GLOBEX_STRIPE", GLOBEX_SECRET)
    monkeypatch.setenv("ONCEGUARD_SECRET_ACME_STRIPE", ACME_SECRET)
    provider = _provider(tenant, listener.url)
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    assert submit_form(root, f"/admin/ledger/tenant/{tenant.pk}/change/", slug="globex-2").status_code == 302
    tenant.refresh_from_db()
    assert (tenant.slug, tenant.secret_namespace) == ("globex-2", "ACME")
    for name in ("ONCEGUARD_SECRET_GLOBEX_STRIPE", "ONCEGUARD_SECRET_GLOBEX_2_STRIPE", "ONCEGUARD_SECRET_GLOBEX2_X"):
        with pytest.raises(ValidationFailed):
            _provider(tenant, listener.url, auth_secret_env=name)
    _aimed_by_hand_at(provider, "ONCEGUARD_SECRET_GLOBEX_STRIPE")
    assert _submit_and_run(tenant, "k-renamed").status == S.FAILED
    assert listener.connections == 0
    _aimed_by_hand_at(provider, "ONCEGUARD_SECRET_ACME_STRIPE")
    assert _submit_and_run(tenant, "k-own").status == S.SUCCEEDED
    assert GLOBEX_SECRET not in listener.everything() and ACME_SECRET in listener.everything()


# --- Tenants are the platform's -------------------------------------------------------------------


PLATFORM_FIELDS = {
    "slug": "globex",
    "name": "Evil Corp",
    "eligibility_url": "http://127.0.0.1:9/steal",
    "callback_allow_list": '["http://127.0.0.1:9/"]',
    "budget_amount": "999999",
    "budget_period_seconds": "1",
    "max_in_flight": "100000",
    "max_unresolved": "100000",
    "max_queued_bytes": "100000",
    "secret_namespace": "GLOBEX",
}


def _platform_values(tenant: Tenant) -> tuple:
    t = Tenant.objects.get(pk=tenant.pk)
    return tuple(str(getattr(t, name)) for name in PLATFORM_FIELDS)


@pytest.mark.parametrize("grant", ["admin role", "admin role and change_tenant granted to the person"])
def test_a_tenant_admin_cannot_change_any_platform_field_of_its_tenant_through_the_console(tenant, grant):
    perms = ["ledger.change_tenant", "ledger.add_tenant", "ledger.delete_tenant"] if "granted" in grant else []
    admin = client_for(staff("ada", role="admin", tenants=[tenant], perms=perms))
    before = _platform_values(tenant)
    url = f"/admin/ledger/tenant/{tenant.pk}/change/"
    status, text = page(admin, url)
    assert status == 200 and 'name="slug"' not in text and 'name="eligibility_url"' not in text
    assert "ONCEGUARD_SECRET_ACME_&lt;NAME&gt;" in text
    response = admin.post(url, {**PLATFORM_FIELDS, "_save": "Save"})
    assert response.status_code == 403
    assert admin.post("/admin/ledger/tenant/add/", {**PLATFORM_FIELDS, "slug": "new"}).status_code == 403
    assert admin.post(f"/admin/ledger/tenant/{tenant.pk}/delete/", {"post": "yes"}).status_code == 403
    assert _platform_values(tenant) == before
    assert not Tenant.objects.filter(slug="new").exists()
    assert not ConfigChange.objects.filter(object_type="ledger.tenant", action="update").exists()


def test_a_superusers_slug_change_is_audited_and_no_form_sets_the_namespace(tenant):
    root = client_for(User.objects.create_superuser("root", password="x" * 12))
    url = f"/admin/ledger/tenant/{tenant.pk}/change/"
    response = submit_form(root, url, slug="acme-renamed", secret_namespace="GLOBEX")
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.slug, tenant.secret_namespace) == ("acme-renamed", "ACME")
    change = ConfigChange.objects.filter(object_type="ledger.tenant", action="update").latest("id")
    assert (
        change.actor == "user:root" and change.before == {"slug": "acme"} and change.after == {"slug": "acme-renamed"}
    )
    # A new "acme", added by the superuser in the console, gets a namespace of its own on its
    # first save: ACME stays the renamed tenant's.
    response = submit_form(root, "/admin/ledger/tenant/add/", slug="acme", name="Acme again", secret_namespace="X")
    assert response.status_code == 302
    again = Tenant.objects.get(slug="acme").secret_namespace
    assert again != "X" and not again.startswith("ACME") and again.isalnum()


# --- Users are told which names they may use -----------------------------------------------------


def test_the_api_the_console_form_and_the_command_name_the_tenants_variables(tenant, make_client, listener):
    provider = _provider(tenant, listener.url, auth_secret_env="ONCEGUARD_SECRET_ACME_STRIPE")
    body = make_client(tenant, ["read"]).get(f"/api/v1/providers/{provider.slug}").json()
    assert body["secret_env_names"] == "ONCEGUARD_SECRET_ACME_<NAME>"
    assert body["auth_secret_env"] == "ONCEGUARD_SECRET_ACME_STRIPE"
    admin = client_for(staff("ada", role="admin", tenants=[tenant]))
    _, text = page(admin, f"/admin/ledger/provider/{provider.pk}/change/")
    assert "this tenant may read ONCEGUARD_SECRET_ACME_&lt;NAME&gt;" in text
    _, text = page(admin, "/admin/ledger/provider/add/")
    assert "acme: ONCEGUARD_SECRET_ACME_&lt;NAME&gt;" in text
    response = submit_form(admin, f"/admin/ledger/provider/{provider.pk}/change/", auth_secret_env="DATABASE_URL")
    assert response.status_code == 200 and "ONCEGUARD_SECRET_ACME_&lt;NAME&gt;" in response.content.decode()
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="ONCEGUARD_SECRET_ACME_<NAME>"):
        call_command(
            "provider_upsert",
            "--tenant=acme",
            "--slug=exfil",
            f"--base-url={listener.url}",
            "--class=key_advisory",
            "--auth-secret-env=ONCEGUARD_SECRET_GLOBEX_STRIPE",
            stdout=StringIO(),
        )


# --- The migration: every existing tenant gets its namespace; out-of-namespace references pause --

BEFORE_NAMESPACES = [("ledger", "0031_sealed_values_as_bytes")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_valid_namespaces_and_pauses_every_reference_outside_its_tenants():
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    try:
        old = executor.migrate(BEFORE_NAMESPACES).apps
        OldTenant, OldProvider = old.get_model("ledger", "Tenant"), old.get_model("ledger", "Provider")
        made = {
            slug: OldTenant.objects.create(slug=slug, name=slug)
            for slug in ("acme", "acme-x", "acmecorp", "beta-x", "beta_x")
        }
        references = {
            ("acme", "own"): "ONCEGUARD_SECRET_ACME_STRIPE",  # kept: ACME stays acme's
            ("acme", "underscored"): "ONCEGUARD_SECRET_ACME_STRIPE_KEY",  # NAME with "_": paused
            ("acme", "none"): "",
            ("acme-x", "legacy"): "ONCEGUARD_SECRET_ACME_X_STRIPE",  # acme-x's slug-made name: paused
            ("acmecorp", "legacy"): "ONCEGUARD_SECRET_ACMECORP_KEY",  # ACMECORP overlaps ACME: paused
            ("beta-x", "legacy"): "ONCEGUARD_SECRET_BETA_X_KEY",
            ("beta_x", "legacy"): "ONCEGUARD_SECRET_BETA_X_KEY",
            ("acme", "paused-before"): "DATABASE_URL",
        }
        for (slug, name), env in references.items():
            OldProvider.objects.create(
                tenant=made[slug], slug=name, idempotency_class="key_advisory", auth_secret_env=env
            )
        OldProvider.objects.filter(slug="paused-before").update(paused_at="2026-01-01T00:00:00Z", paused_reason="401")

        MigrationExecutor(connection).migrate(leaves)

        spaces = dict(Tenant.objects.values_list("slug", "secret_namespace"))
        assert spaces["acme"] == "ACME" and spaces["beta-x"] == "BETAX"
        values = list(spaces.values())
        assert len(set(values)) == len(values)
        assert not any(a != b and a.startswith(b) for a in values for b in values)
        paused = {
            (p.tenant.slug, p.slug): p.paused_reason
            for p in Provider.objects.select_related("tenant").filter(paused_at__isnull=False)
        }
        assert set(paused) == {
            ("acme", "underscored"),
            ("acme-x", "legacy"),
            ("acmecorp", "legacy"),
            ("beta-x", "legacy"),
            ("beta_x", "legacy"),
            ("acme", "paused-before"),
        }
        # In words: what is wrong and which names the tenant may read now.
        reason = paused[("acme-x", "legacy")]
        assert "ONCEGUARD_SECRET_ACME_X_STRIPE" in reason and f"ONCEGUARD_SECRET_{spaces['acme-x']}_<NAME>" in reason
        assert "DATABASE_URL" in paused[("acme", "paused-before")]
        # Resumed once the platform admin fixes the reference.
        legacy = Provider.objects.get(tenant__slug="acme-x", slug="legacy")
        services.provider_upsert(
            tenant=legacy.tenant,
            slug="legacy",
            base_url="http://127.0.0.1:9",
            idempotency_class=IdempotencyClass.KEY_ADVISORY,
            auth_secret_env=f"ONCEGUARD_SECRET_{spaces['acme-x']}_STRIPE",
        )
        assert services.provider_resume(provider_id=legacy.pk, actor="user:root")
    finally:
        MigrationExecutor(connection).migrate(leaves)
