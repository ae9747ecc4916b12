"""An entry's key may be set by a person (KeySource.SET_BY_PERSON): a new choice only, no SQL."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("dlq", "0014_replay_target_class"),
    ]

    operations = [
        migrations.AlterField(
            model_name="failedevent",
            name="key_source",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "the entry's identity"),
                    ("reported", "named by the report"),
                    ("reported_event", "named by the report, with its own event id"),
                    ("request_header", "the failed request's key header"),
                    ("request_field", "the declared field of the failed request"),
                    ("missing", "none found"),
                    ("set", "set by a person"),
                ],
                db_default="",
                default="",
                max_length=16,
            ),
        ),
    ]
