"""``ToolCall.suspension_version`` (issue 45): a ``write``'s file version when its call suspended,
the one every notice showed. An approval that passes no later version it displayed is bound to it
(durable.binding), so a person's edit made while the call waited is never overwritten by an
approval that did not show it. A nullable column: no table rewrite; rows from before it are None
(the write then needs the model's own read of the file as it is)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("nexo_django", "0014_cycle_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="toolcall",
            name="suspension_version",
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
    ]
