"""Conversations and live progress (issue 25): ``AgentRun.previous`` links a follow-up to the run
it continues; on PostgreSQL a trigger sends ``NOTIFY nexo_events`` with the run's id whenever an
event row is inserted (delivered at commit, from any process), which wakes the run pages'
event streams (``nexo_django.durable.live``). Other databases get no trigger: the streams poll."""

import django.db.models.deletion
from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION nexo_django_event_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('nexo_events', NEW.run_id::text);
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER nexo_django_event_notify AFTER INSERT ON {table}
    FOR EACH ROW EXECUTE FUNCTION nexo_django_event_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS nexo_django_event_notify ON {table};
DROP FUNCTION IF EXISTS nexo_django_event_notify();
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            table = schema_editor.quote_name(apps.get_model("nexo_django", "RunEvent")._meta.db_table)
            schema_editor.execute(sql.format(table=table))

    return run


class Migration(migrations.Migration):

    dependencies = [
        ("nexo_django", "0009_stored_sizes"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentrun",
            name="previous",
            field=models.OneToOneField(
                blank=True, help_text="The run this one continues (a follow-up).", null=True,
                on_delete=django.db.models.deletion.PROTECT, related_name="next_run", to="nexo_django.agentrun",
            ),
        ),
        migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP), elidable=False),
    ]
