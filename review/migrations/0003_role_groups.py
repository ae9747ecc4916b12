"""Data migration: the console's role groups (operator, reviewer, auditor, admin)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


def create_role_groups(apps, schema_editor):
    # Permissions are normally created after all migrations (post_migrate); create them now
    # so the groups can be given theirs in this migration.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0, using=schema_editor.connection.alias)
        app_config.models_module = None
    from review.staff.roles import sync_role_groups

    sync_role_groups(apps, using=schema_editor.connection.alias)


def drop_role_groups(apps, schema_editor):
    from review.staff.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("review", "0002_console_privacy_retention"),
        ("dlq", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_role_groups, drop_role_groups)]
