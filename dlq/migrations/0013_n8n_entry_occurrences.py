"""Entries keyed by the business key (DESIGN §7, occurrences): where an entry's key came from
(``key_source``, ``key_note``), the failed request's allow-listed headers, how many failures
it stands for (``occurrence_count`` and one ``FailedEventOccurrence`` row each), the earlier
closed entry of the same key (``previous``), and one open entry per business key, tenant and
target (a partial unique index). Entries already stored have ``key_source = ''`` and are left
as they are: not in the index, shown linked to others of their key by the console.

Locks (PostgreSQL): the columns have database defaults (catalog only); the partial index is
built in the migration's transaction (SHARE on a DLQ-sized table: writes wait briefly).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0012_tenant_on_changes_and_replays'),
        ('ledger', '0031_sealed_values_as_bytes'),
    ]

    operations = [
        migrations.CreateModel(
            name='FailedEventOccurrence',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('identity', models.CharField(max_length=255)),
                ('source_workflow_id', models.CharField(blank=True, max_length=255)),
                ('source_execution_id', models.CharField(blank=True, max_length=255)),
                ('error_message', models.TextField(blank=True)),
                ('error_class', models.CharField(blank=True, choices=[('', 'unclassified'), ('transient', 'transient'), ('invalid_input', 'invalid input'), ('permission', 'permission'), ('ambiguous', 'ambiguous'), ('invalid_output', 'invalid output')], max_length=16)),
                ('at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.AddField(
            model_name='failedevent',
            name='key_note',
            field=models.CharField(blank=True, db_default='', default='', max_length=500),
        ),
        migrations.AddField(
            model_name='failedevent',
            name='key_field',
            field=models.CharField(blank=True, db_default='', default='', max_length=255),
        ),
        migrations.AddField(
            model_name='failedevent',
            name='key_source',
            field=models.CharField(blank=True, choices=[('', "the entry's identity"), ('reported', 'named by the report'), ('reported_event', 'named by the report, with its own event id'), ('request_header', "the failed request's key header"), ('request_field', 'the declared field of the failed request'), ('missing', 'none found')], db_default='', default='', max_length=16),
        ),
        migrations.AddField(
            model_name='failedevent',
            name='occurrence_count',
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name='failedevent',
            name='previous',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='dlq.failedevent'),
        ),
        migrations.AddField(
            model_name='failedevent',
            name='request_headers',
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddConstraint(
            model_name='failedevent',
            constraint=models.UniqueConstraint(condition=models.Q(('key_source__in', ['reported', 'request_field', 'request_header']), ('status__in', ['pending', 'replaying'])), fields=('tenant', 'original_key', 'replay_target_slug'), name='failedevent_one_open_per_key'),
        ),
        migrations.AddField(
            model_name='failedeventoccurrence',
            name='event',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='occurrences', to='dlq.failedevent'),
        ),
        migrations.AddField(
            model_name='failedeventoccurrence',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ledger.tenant'),
        ),
        migrations.AddConstraint(
            model_name='failedeventoccurrence',
            constraint=models.UniqueConstraint(fields=('tenant', 'event', 'number'), name='feoccurrence_unique_number'),
        ),
    ]
