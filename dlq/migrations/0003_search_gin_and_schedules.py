"""PostgreSQL: a GIN index for `search_fields @> {...}` (SQLite has no JSON containment and
filters key by key). Everywhere: the DLQ's django-q2 schedules (see dlq.schedules)."""

from django.db import migrations


def create_gin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS fe_search_fields_gin ON dlq_failedevent USING gin (search_fields jsonb_path_ops)"
        )


def drop_gin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS fe_search_fields_gin")


def install_schedules(apps, schema_editor):
    from dlq.schedules import install_schedules as install

    install(apps.get_model("django_q", "Schedule"))


def remove_schedules(apps, schema_editor):
    from dlq.schedules import SCHEDULES

    apps.get_model("django_q", "Schedule").objects.filter(name__in=list(SCHEDULES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0002_replay_lineage_alerts"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [
        migrations.RunPython(create_gin, drop_gin),
        migrations.RunPython(install_schedules, remove_schedules),
    ]
