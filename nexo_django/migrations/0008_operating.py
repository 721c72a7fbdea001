"""What operating it asked for: the file version an approval of a ``write`` is bound to, and the
indexes the run lists order and filter by (newest first; a user's own runs), and the inbox's
(status, name) index widened with the capability its filter lists."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("nexo_django", "0007_approval_lifecycle")]

    operations = [
        migrations.AddField(
            model_name="decision",
            name="file_version",
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
        migrations.AddIndex(
            model_name="agentrun",
            index=models.Index(fields=["created_at"], name="nexo_run_created"),
        ),
        migrations.RemoveIndex(model_name="toolcall", name="nexo_call_status_name"),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(fields=["status", "name", "capability"], name="nexo_call_status_name_cap"),
        ),
        migrations.AddIndex(
            model_name="agentrun",
            index=models.Index(fields=["created_by", "created_at"], name="nexo_run_by_created"),
        ),
    ]
