"""A tenant's secret namespace: stored, fixed, unique, and no prefix of another's (ADR 0001).

Until now the environment variables a tenant's providers could read were named after its slug
(``ONCEGUARD_SECRET_`` + the slug in upper case, ``-`` as ``_``): a slug change moved them to
another tenant's, ``acme`` reached ``acme-x``'s ``ONCEGUARD_SECRET_ACME_X_…``, and ``beta-x``
and ``beta_x`` shared one set. Each tenant now gets its namespace here, once:

* the one its slug gave, when that is a valid namespace (letters and digits only) and overlaps
  no namespace given before it, in the order the tenants were made — so its references keep
  working;
* otherwise a free one (``ledger.rules.provider_checks.secret_namespace_choose``, deterministic).

Then every provider whose ``auth_secret_env`` falls outside its tenant's namespace is
**paused**, with the reason in words (it would never be read again; kept silently, it was the
hole). The platform's admin renames the variable (or stores the credential on the provider),
fixes the reference and resumes it (console: paused providers; ``manage.py provider_resume``).

Reverse: the column, its constraints and the trigger go; the pauses stay (resuming a provider
is a person's decision, not a migration's).
"""

import re

from django.db import migrations, models
from django.utils import timezone


def _legacy_namespace(slug: str) -> str:
    # The tenant's part of its variables' names before this migration.
    return re.sub(r"[^A-Z0-9]", "_", slug.upper())


def namespaces_assign(apps, schema_editor):
    """Every tenant's namespace; returns {tenant id: namespace} (for the tests)."""
    # Imported here: a migration uses the rule as it is when the migration runs.
    from ledger.rules.provider_checks import namespace_valid, namespaces_overlap, secret_namespace_choose

    Tenant = apps.get_model("ledger", "Tenant")
    tenants = list(Tenant.objects.order_by("pk").values_list("pk", "slug"))
    given: dict[int, str] = {}
    for pk, slug in tenants:
        legacy = _legacy_namespace(slug)
        if namespace_valid(legacy) and not any(namespaces_overlap(legacy, other) for other in given.values()):
            given[pk] = legacy
    for pk, slug in tenants:
        if pk not in given:
            given[pk] = secret_namespace_choose(slug, given.values())
    for pk, namespace in given.items():
        Tenant.objects.filter(pk=pk).update(secret_namespace=namespace)
    return given


def providers_outside_their_namespace_pause(apps, schema_editor):
    """Pauses each provider whose reference its tenant may no longer read; returns their ids."""
    from ledger.rules.provider_checks import NAME_RULE, secret_env_names, secret_env_refusal

    Provider = apps.get_model("ledger", "Provider")
    paused = []
    rows = Provider.objects.exclude(auth_secret_env="").values_list(
        "pk", "auth_secret_env", "tenant__slug", "tenant__secret_namespace"
    )
    for pk, name, slug, namespace in rows:
        if secret_env_refusal(namespace=namespace, name=name) is None:
            continue
        reason = (
            f"credential variable {name[:60]} is not one of tenant {slug[:30]}'s: it may read only"
            f" {secret_env_names(namespace)} ({NAME_RULE}). Rename it or store the credential, then resume."
        )[:200]
        # A provider paused already (a 401, an operator) keeps its time; this reason replaces
        # its first, so whoever resumes it reads what must be fixed first.
        Provider.objects.filter(pk=pk, paused_at__isnull=True).update(paused_at=timezone.now())
        Provider.objects.filter(pk=pk).update(paused_reason=reason, updated_at=timezone.now())
        paused.append(pk)
    return paused


def forwards(apps, schema_editor):
    namespaces_assign(apps, schema_editor)
    providers_outside_their_namespace_pause(apps, schema_editor)


def triggers_install(apps, schema_editor):
    from ledger.tenants.tenant_namespaces import namespace_triggers_install

    namespace_triggers_install(schema_editor.connection)


def triggers_drop(apps, schema_editor):
    from ledger.tenants.tenant_namespaces import namespace_triggers_drop

    namespace_triggers_drop(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0031_sealed_values_as_bytes"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="tenant",
            options={"permissions": [("rotate_callback_secret", "Can rotate a tenant's callback signing secret")]},
        ),
        # Empty until the data step gives each tenant its own; then unique and checked.
        migrations.AddField(
            model_name="tenant",
            name="secret_namespace",
            field=models.CharField(default="", editable=False, max_length=32),
            preserve_default=False,
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="tenant",
            name="secret_namespace",
            field=models.CharField(editable=False, max_length=32, unique=True),
        ),
        migrations.AddConstraint(
            model_name="tenant",
            constraint=models.CheckConstraint(
                condition=models.Q(("secret_namespace__regex", "\\A[A-Z0-9]{1,32}\\Z")),
                name="tenant_secret_namespace_valid",
            ),
        ),
        migrations.RunPython(triggers_install, triggers_drop),
    ]
