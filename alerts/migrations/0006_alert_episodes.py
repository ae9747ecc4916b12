"""Alert episodes: alerts resolve themselves and a recurrence opens a new one (DESIGN §
alerts, alerts.clearing).

``episode`` numbers the alerts of one (tenant, kind, ref); the dedup key ends in it instead of
a time bucket. Existing rows are episode 1 and keep their old keys (``kind:ref:<bucket>``, which
the new ``kind:ref:e<n>`` keys never equal). Two indexes: (tenant, kind, ref) for a raise's
lookup, and the unresolved alerts' ids for the clearing evaluator.

**Locks (PostgreSQL)**: ``ADD COLUMN … DEFAULT 1`` is a catalog change (no rewrite, PG 11+);
each ``CREATE INDEX`` holds a SHARE lock on the alerts table while it builds (a small table:
rows are written per incident, not per request).
"""

from django.db import migrations, models

# The clearing evaluator's schedule (alerts.schedules), installed here as alerts 0001 installed
# the flush, so an upgrade runs it without a `schedules_install`.
RESOLVE = ("alerts: resolve what has cleared", "alerts.tasks.alerts_resolve_cleared_task")


def install_resolve_schedule(apps, schema_editor):
    name, func = RESOLVE
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name=name, defaults={"func": func, "schedule_type": "I", "minutes": 1, "repeats": -1}
    )


def remove_resolve_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name=RESOLVE[0]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0005_sealed_webhook_urls'),
        ('django_q', '0018_task_success_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='alert',
            name='episode',
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.AddIndex(
            model_name='alert',
            index=models.Index(fields=['tenant', 'kind', 'ref'], name='alert_tenant_kind_ref_idx'),
        ),
        migrations.AddIndex(
            model_name='alert',
            index=models.Index(condition=models.Q(('resolved_at__isnull', True)), fields=['id'], name='alert_unresolved_idx'),
        ),
        migrations.RunPython(install_resolve_schedule, remove_resolve_schedule),
    ]
