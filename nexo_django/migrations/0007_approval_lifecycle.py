"""Approval lifecycle: when a waiting call expires, who was emailed about it, standing rules
that decide calls at once (and which rule made a decision)."""

from __future__ import annotations


import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('nexo_django', '0006_fk_indexes_covered'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApprovalRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('agent', models.CharField(blank=True, default='', help_text='Dotted path of the Agent class; empty: any agent.', max_length=255)),
                ('tool', models.CharField(help_text='Exact tool name (MCP tools by their qualified name).', max_length=200)),
                ('path', models.CharField(blank=True, default='', help_text='read/write: an fnmatch pattern on the /-rooted path (e.g. /notes/*); empty: any path. shell: the whole command, matched exactly (never a prefix). Other tools: leave empty.', max_length=1000)),
                ('verdict', models.CharField(choices=[('approved', 'Approved'), ('denied', 'Denied')], default='approved', max_length=10)),
                ('enabled', models.BooleanField(default=True)),
                ('expires_at', models.DateTimeField(blank=True, help_text='After this the rule decides nothing.', null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('note', models.TextField(blank=True, default='', help_text='Why; kept with each decision it makes.')),
            ],
            options={
                'ordering': ['tool', 'agent', 'path', 'id'],
            },
        ),
        migrations.AddField(
            model_name='toolcall',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='toolcall',
            name='notified_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='toolcall',
            name='reminded_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(fields=['status', 'expires_at'], name='nexo_call_status_expires'),
        ),
        migrations.AddField(
            model_name='approvalrule',
            name='created_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='decision',
            name='rule',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='decisions', to='nexo_django.approvalrule'),
        ),
        migrations.AddIndex(
            model_name='approvalrule',
            index=models.Index(fields=['enabled', 'tool'], name='nexo_rule_enabled_tool'),
        ),
    ]
