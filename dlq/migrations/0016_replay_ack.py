from django.db import migrations, models


class Migration(migrations.Migration):
    """Replay acknowledgements (ADR 0007). Targets stored before keep what they did — a 2xx
    counts as delivered ("status") — so no working deployment's replays turn into failures on
    upgrade; they are left unconfirmed, and the console lists them ("acknowledgement not
    confirmed") for the operator to move each n8n receiver to "echo" once its workflow sends
    Onceguard-Ack. New rows are confirmed (the service says otherwise for undeclared ones)."""

    dependencies = [
        ("dlq", "0015_key_set_by_person"),
    ]

    operations = [
        migrations.AddField(
            model_name="replaytarget",
            name="ack",
            field=models.CharField(
                choices=[("echo", "echo (the receiver signs the replay id back)"), ("status", "status (a 2xx is enough)")],
                db_default="status",
                default="status",
                help_text="Echo: a replay counts as delivered only when the receiver answers Onceguard-Ack (the"
                " replay-receiver template does, from its Respond node after the work succeeded); required for n8n"
                " receivers, whose 2xx alone may be n8n's own answer for a workflow that stopped half-way."
                " Status: a 2xx is enough (a key-enforced API that answers its own bodies).",
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name="replaytarget",
            name="ack_confirmed",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterField(
            model_name="replaytarget",
            name="ack_confirmed",
            field=models.BooleanField(db_default=True, default=True),
        ),
    ]
