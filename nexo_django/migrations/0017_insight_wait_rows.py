"""The wait histogram in one row per key (issue 50's cost at scale).

``InsightWait`` kept one row per (grain, day, agent, tool, reviewer) and wait bucket: a month's
dashboard summed ~50,000 rows at a million decisions. It now keeps one row per key with a column
per bucket (``b0`` .. ``b79``, 0 by the database's default, so that a decision's upsert names its
own bucket only; waits in buckets 79 and up, over about 14 months, share the last)
and the row's total in ``count``: a tenth of the rows. The new table is made beside the old, the
rows folded into it in the database (one ``INSERT ... SELECT``), the old one dropped and the new
one renamed: each of 80 added columns would copy the whole table on SQLite (eight minutes at a
million decisions, against seconds). Going back spreads the rows out again.
"""

from django.db import migrations, models

BUCKETS = 80
KEY = ("grain", "day", "agent", "tool", "reviewer")
OLD, NEW = "nexo_django_insightwait", "nexo_django_insightwaitrows"


def fold(apps, schema_editor):
    q = schema_editor.connection.ops.quote_name
    key = ", ".join(q(c) for c in KEY)
    last = BUCKETS - 1
    sums = ", ".join(
        f"SUM(CASE WHEN {q('bucket')} {'>=' if i == last else '='} {i} THEN {q('count')} ELSE 0 END)"
        for i in range(BUCKETS))
    buckets = ", ".join(q(f"b{i}") for i in range(BUCKETS))
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {q(NEW)} ({key}, {q('count')}, {buckets}) "
                       f"SELECT {key}, SUM({q('count')}), {sums} FROM {q(OLD)} GROUP BY {key}")


def spread(apps, schema_editor):
    q = schema_editor.connection.ops.quote_name
    key = ", ".join(q(c) for c in KEY)
    with schema_editor.connection.cursor() as cursor:
        for i in range(BUCKETS):
            column = q(f"b{i}")
            cursor.execute(f"INSERT INTO {q(OLD)} ({key}, {q('bucket')}, {q('count')}) "
                           f"SELECT {key}, {i}, {column} FROM {q(NEW)} WHERE {column} > 0")


class Migration(migrations.Migration):

    dependencies = [
        ("nexo_django", "0016_insight"),
    ]

    operations = [
        migrations.CreateModel(
            name="InsightWaitRows",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("grain", models.CharField(max_length=1)),
                ("day", models.DateField()),
                ("agent", models.CharField(max_length=255)),
                ("tool", models.CharField(max_length=200)),
                ("reviewer", models.BigIntegerField()),
                ("count", models.BigIntegerField()),
                *((f"b{i}", models.BigIntegerField(default=0, db_default=0)) for i in range(BUCKETS)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=KEY, name="nexo_wait_row_key")],
            },
        ),
        migrations.RunPython(fold, spread),
        migrations.DeleteModel(name="InsightWait"),
        migrations.RenameModel(old_name="InsightWaitRows", new_name="InsightWait"),
    ]
