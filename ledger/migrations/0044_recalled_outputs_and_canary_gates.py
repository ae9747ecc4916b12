"""Recalled outputs, consumer verdicts and canary gates (ADR 0020).

Safe on a live ``ledger_operationoutput`` of 10M rows:

- the new output columns are nullable or carry a constant database default: PostgreSQL 11+
  adds them without rewriting the table (a catalogue change under a brief lock);
- the two CHECKs on the outputs are added ``NOT VALID`` (no scan under the exclusive lock)
  and validated afterwards under SHARE UPDATE EXCLUSIVE, which lets reads and writes go on;
- the recall pass's index (revision, state, id) is built ``CONCURRENTLY`` (no lock on writes; an
  interrupted build's invalid index is dropped by a rerun first), so this migration is not
  atomic;
- the outputs published before it learn their adapter revision from their operation in
  batches of ``BATCH`` rows by id, each its own short transaction (a rerun continues where it
  stopped: only rows still without one are touched).

Everything reverses (the backfill's reverse is nothing: the column goes with the field).
Elsewhere (SQLite) the schema editor's plain statements.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models


BATCH = 5000
REV_STATE = models.Index(fields=["adapter_revision", "state", "id"], name="opoutput_rev_state_idx")
STATE_VALID = models.CheckConstraint(
    condition=models.Q(("state__in", ["published", "quarantined", "flagged"])), name="opoutput_state_valid"
)
RECALLED_HAS_TIME = models.CheckConstraint(
    condition=models.Q(
        models.Q(("state", "published"), ("recalled_at__isnull", True)),
        models.Q(models.Q(("state", "published"), _negated=True), ("recalled_at__isnull", False)),
        _connector="OR",
    ),
    name="opoutput_recalled_has_time",
)
CHECKS_SQL = {
    STATE_VALID.name: "state IN ('published', 'quarantined', 'flagged')",
    RECALLED_HAS_TIME.name: "(state = 'published' AND recalled_at IS NULL)"
    " OR (state <> 'published' AND recalled_at IS NOT NULL)",
}


def _postgres(schema_editor: Any) -> bool:
    return schema_editor.connection.vendor == "postgresql"


def index_forwards(apps: Any, schema_editor: Any) -> None:
    if _postgres(schema_editor):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {REV_STATE.name}")
        schema_editor.execute(
            f"CREATE INDEX CONCURRENTLY {REV_STATE.name} ON ledger_operationoutput (adapter_revision_id, state, id)"
        )
    else:
        schema_editor.add_index(apps.get_model("ledger", "OperationOutput"), REV_STATE)


def index_backwards(apps: Any, schema_editor: Any) -> None:
    if _postgres(schema_editor):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {REV_STATE.name}")
    else:
        schema_editor.remove_index(apps.get_model("ledger", "OperationOutput"), REV_STATE)


def checks_forwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "OperationOutput")
    if not _postgres(schema_editor):
        for check in (STATE_VALID, RECALLED_HAS_TIME):
            schema_editor.add_constraint(model, check)
        return
    for name, condition in CHECKS_SQL.items():
        schema_editor.execute(f"ALTER TABLE ledger_operationoutput DROP CONSTRAINT IF EXISTS {name}")
        schema_editor.execute(f"ALTER TABLE ledger_operationoutput ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
        schema_editor.execute(f"ALTER TABLE ledger_operationoutput VALIDATE CONSTRAINT {name}")


def checks_backwards(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("ledger", "OperationOutput")
    if not _postgres(schema_editor):
        for check in (STATE_VALID, RECALLED_HAS_TIME):
            schema_editor.remove_constraint(model, check)
        return
    for name in CHECKS_SQL:
        schema_editor.execute(f"ALTER TABLE ledger_operationoutput DROP CONSTRAINT IF EXISTS {name}")


def recalled_rerun_requests_forget(apps: Any, schema_editor: Any) -> None:
    """Going back: the re-runs of recalled outputs waiting for (or past) a second person go with
    the kind (the older CHECK would refuse them and stop the reversal halfway)."""
    apps.get_model("ledger", "ApprovalRequest").objects.filter(kind="recalled_rerun").delete()


def revisions_backfill(apps: Any, schema_editor: Any) -> None:
    """Each output's revision from its operation, in short batches by id."""
    model = apps.get_model("ledger", "OperationOutput")
    highest = model.objects.order_by("-id").values_list("id", flat=True).first() or 0
    with schema_editor.connection.cursor() as cursor:
        for start in range(0, highest + 1, BATCH):
            cursor.execute(
                "UPDATE ledger_operationoutput SET adapter_revision_id = (SELECT o.adapter_revision_id FROM"
                " ledger_operation o WHERE o.id = ledger_operationoutput.operation_id)"
                " WHERE id >= %s AND id < %s AND adapter_revision_id IS NULL",
                [start, start + BATCH],
            )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0043_operation_search_rows"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutputVerdict",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "source",
                    models.CharField(
                        choices=[("consumer", "consumer"), ("manifest", "evaluation manifest")], max_length=10
                    ),
                ),
                ("actor", models.CharField(max_length=150)),
                (
                    "verdict",
                    models.CharField(choices=[("accepted", "accepted"), ("rejected", "rejected")], max_length=10),
                ),
                ("score", models.FloatField(blank=True, null=True)),
                ("reason", models.CharField(blank=True, default="", max_length=500)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": "ledger_outputverdict",
            },
        ),
        migrations.RemoveConstraint(
            model_name="approvalrequest",
            name="approval_request_kind_valid",
        ),
        # Backwards, before the older kind CHECK returns: requests of the kind it does not know.
        migrations.RunPython(migrations.RunPython.noop, recalled_rerun_requests_forget),
        migrations.AddField(
            model_name="adapterrevision",
            name="gates",
            field=models.JSONField(blank=True, db_default={}, default=dict),
        ),
        migrations.AddField(
            model_name="adapterrevision",
            name="rolled_back_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="operationoutput",
            name="adapter_revision",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="ledger.adapterrevision",
            ),
        ),
        migrations.AddField(
            model_name="operationoutput",
            name="consumed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="operationoutput",
            name="recall_reason",
            field=models.CharField(blank=True, db_default="", default="", max_length=500),
        ),
        migrations.AddField(
            model_name="operationoutput",
            name="recalled_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="operationoutput",
            name="state",
            field=models.CharField(
                choices=[
                    ("published", "published"),
                    ("quarantined", "quarantined (rolled-back revision)"),
                    ("flagged", "produced by a rolled-back revision"),
                ],
                db_default="published",
                default="published",
                max_length=12,
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="canary_pause_evidence",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="provider",
            name="canary_paused_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="approvalrequest",
            name="kind",
            field=models.CharField(
                choices=[
                    ("replay", "replay"),
                    ("rerun_as_new", "re-run as new"),
                    ("forced_reissue", "forced re-issue"),
                    ("corrected_replay", "corrected replay"),
                    ("bulk_replay", "bulk replay"),
                    ("run_resume", "run resumed"),
                    ("safe_to_resend", 'decision "safe to resend"'),
                    ("safe_to_retry", 'review decision "safe to retry"'),
                    ("recalled_rerun", "re-run of recalled outputs"),
                ],
                max_length=20,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="operationoutput", index=REV_STATE)],
            database_operations=[migrations.RunPython(index_forwards, index_backwards)],
        ),
        migrations.AddConstraint(
            model_name="approvalrequest",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "kind__in",
                        [
                            "replay",
                            "rerun_as_new",
                            "forced_reissue",
                            "corrected_replay",
                            "bulk_replay",
                            "run_resume",
                            "safe_to_resend",
                            "safe_to_retry",
                            "recalled_rerun",
                        ],
                    )
                ),
                name="approval_request_kind_valid",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(model_name="operationoutput", constraint=STATE_VALID),
                migrations.AddConstraint(model_name="operationoutput", constraint=RECALLED_HAS_TIME),
            ],
            database_operations=[migrations.RunPython(checks_forwards, checks_backwards)],
        ),
        migrations.RunPython(revisions_backfill, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="provider",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("canary_paused_at__isnull", True), ("canary_revision__isnull", False), _connector="OR"
                ),
                name="provider_paused_canary_exists",
            ),
        ),
        migrations.AddField(
            model_name="outputverdict",
            name="adapter_revision",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="ledger.adapterrevision",
            ),
        ),
        migrations.AddField(
            model_name="outputverdict",
            name="operation",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="ledger.operation",
            ),
        ),
        migrations.AddField(
            model_name="outputverdict",
            name="output",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="verdicts",
                to="ledger.operationoutput",
            ),
        ),
        migrations.AddField(
            model_name="outputverdict",
            name="tenant",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name="+", to="ledger.tenant"
            ),
        ),
        migrations.AddIndex(
            model_name="outputverdict",
            index=models.Index(fields=["adapter_revision", "created_at"], name="outputverdict_rev_time_idx"),
        ),
        migrations.AddConstraint(
            model_name="outputverdict",
            constraint=models.UniqueConstraint(
                fields=("tenant", "operation", "source", "actor"), name="outputverdict_one_per_caller"
            ),
        ),
        migrations.AddConstraint(
            model_name="outputverdict",
            constraint=models.CheckConstraint(
                condition=models.Q(("source__in", ["consumer", "manifest"])), name="outputverdict_source_valid"
            ),
        ),
        migrations.AddConstraint(
            model_name="outputverdict",
            constraint=models.CheckConstraint(
                condition=models.Q(("verdict__in", ["accepted", "rejected"])), name="outputverdict_verdict_valid"
            ),
        ),
        migrations.AddConstraint(
            model_name="outputverdict",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("score__isnull", True), models.Q(("score__gte", 0), ("score__lte", 1)), _connector="OR"
                ),
                name="outputverdict_score_in_range",
            ),
        ),
    ]
