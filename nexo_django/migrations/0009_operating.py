"""What operating it asked for: the file version an approval of a ``write`` is bound to."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("nexo_django", "0006_fk_indexes_covered")]

    operations = [
        migrations.AddField(
            model_name="decision",
            name="file_version",
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
    ]
