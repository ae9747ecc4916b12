"""Alerts now belong to the alerts app (alerts.0001 adopted and renamed their tables): the
DLQ forgets the models, and the database is not touched."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0005_alertdelivery_plural"),
        ("alerts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(model_name="alertchannel", name="tenant"),
                migrations.RemoveField(model_name="alertdelivery", name="channel"),
                migrations.DeleteModel(name="Alert"),
                migrations.DeleteModel(name="AlertChannel"),
                migrations.DeleteModel(name="AlertDelivery"),
            ]
        ),
    ]
