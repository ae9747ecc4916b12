"""The keyed access-log chain (review.audit.accesslog): rows carry their chain version and key
id; signed checkpoints anchor each chain. Rows that exist now are the unkeyed v1 chain:
each tenant's v1 head (and the purge anchor its RetentionRuns recorded, unsigned until now)
is sealed by a signed checkpoint, so they keep verifying and no v1 row can be added later.
Needs the access-log key only when there are rows (generated under var/ if none is set)."""

import django.db.models.deletion
from django.db import migrations, models

# The signing code is the application's own: a migration with a copy of it would sign
# checkpoints that the verifier computes differently.
from review.audit.accesslog import accesslog_seal_legacy


def seal_legacy_rows(apps, schema_editor):
    accesslog_seal_legacy(
        access_log_model=apps.get_model("review", "AccessLog"),
        checkpoint_model=apps.get_model("review", "AccessLogCheckpoint"),
        retention_run_model=apps.get_model("review", "RetentionRun"),
    )


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0007_tombstone_from_review'),
        ('review', '0005_tombstone_to_ledger'),
    ]

    operations = [
        migrations.AddField(
            model_name='accesslog',
            name='chain_version',
            field=models.CharField(default='v1', max_length=4),
        ),
        migrations.AddField(
            model_name='accesslog',
            name='key_id',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.CreateModel(
            name='AccessLogCheckpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('n', models.PositiveBigIntegerField()),
                ('kind', models.CharField(choices=[('head', 'head'), ('purge', 'purge anchor'), ('legacy', 'end of the unkeyed rows')], max_length=8)),
                ('seq', models.PositiveBigIntegerField()),
                ('hash', models.CharField(max_length=64)),
                ('at', models.DateTimeField()),
                ('key_id', models.CharField(max_length=32)),
                ('signature', models.CharField(max_length=64)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.tenant')),
            ],
            options={
                'verbose_name': 'access-log checkpoint',
                'ordering': ['-at', '-id'],
                'constraints': [models.UniqueConstraint(fields=('tenant', 'n'), name='accesslogcheckpoint_unique_n')],
            },
        ),
        migrations.RunPython(seal_legacy_rows, migrations.RunPython.noop),
    ]
