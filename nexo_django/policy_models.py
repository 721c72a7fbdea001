"""Approval policies: who must approve which calls, how many must, and who is told when nobody does.

The models only; what they mean is :mod:`nexo_django.durable.policy`. :mod:`nexo_django.models`
re-exports them (one place to import the models from).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from .display import mark_hidden

#: The capabilities a policy may name (``""``: any), as the gate names them.
POLICY_CAPABILITIES = (("", "any"), ("read", "read"), ("write", "write"), ("glob", "glob"), ("shell", "shell"),
                       ("fetch", "fetch"), ("search", "search"), ("mcp", "MCP tool"))


class ApprovalPolicy(models.Model):
    """Routes the calls it matches to its approver groups, with a quorum, an escalation and a
    first-pass reviewer. Changed in the admin, audited as :class:`ApprovalPolicyChange`."""

    name = models.CharField(max_length=200, unique=True)
    order = models.PositiveIntegerField(default=100, help_text="Lower first: the first enabled match routes a call.")
    agent = models.CharField(max_length=255, blank=True, default="", help_text="Dotted path of the Agent class; empty: any agent.")
    capability = models.CharField(max_length=20, blank=True, default="", choices=POLICY_CAPABILITIES)
    tool = models.CharField(max_length=200, blank=True, default="", help_text="Exact tool name; empty: any tool.")
    target = models.CharField(
        max_length=1000, blank=True, default="",
        help_text="read/write: an fnmatch pattern on the /-rooted path (/deploy/*); shell: the whole command, exactly; "
        "fetch: the host or a pattern (*.example.com); MCP: 'server: tool' or a pattern ('github: *'). Empty: any.",
    )
    approvers = models.ManyToManyField("auth.Group", related_name="+", blank=True,
                                       help_text="Only members of these groups decide the calls it matches.")
    quorum = models.PositiveSmallIntegerField(default=1, help_text="Distinct approvals a call needs.")
    escalate_after = models.DurationField(null=True, blank=True,
                                          help_text="After this long with no decision the escalation groups are told and may decide.")
    escalation_groups = models.ManyToManyField("auth.Group", related_name="+", blank=True)
    reviewer = models.CharField(max_length=255, blank=True, default="",
                                help_text="Dotted path of an Agent class that reviews each call first (advice only).")
    reviewer_may_deny = models.BooleanField(default=False, help_text="The reviewer may deny a call it finds high risk.")
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["order", "id"]
        verbose_name_plural = "approval policies"

    def __str__(self) -> str:
        return mark_hidden(self.name)


class ApprovalPolicyChange(models.Model):
    """One change of a policy (created, changed, deleted): who, when, before and after. Its id is
    the policies' version: a call keeps the version it suspended under (``ToolCall.policy_version``)
    and is decided by the policies as they stood at that version."""

    policy = models.ForeignKey(ApprovalPolicy, null=True, blank=True, on_delete=models.SET_NULL, related_name="changes")
    policy_pk = models.BigIntegerField()
    action = models.CharField(max_length=10)  # "created", "changed", "deleted"
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    changed_at = models.DateTimeField(auto_now_add=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["policy_pk", "id"]
        indexes = [models.Index(fields=["policy_pk", "changed_by"], name="nexo_policychange_by")]

    def __str__(self) -> str:
        return f"policy #{self.policy_pk} {self.action} by {self.changed_by or 'nobody known'}"


class Approval(models.Model):
    """One person's approval of a call a policy requires several approvals of; the call is decided
    (its :class:`~nexo_django.models.Decision`) when the last one needed lands. Immutable."""

    tool_call = models.ForeignKey("nexo_django.ToolCall", on_delete=models.CASCADE, related_name="approvals",
                                  db_index=False)
    approved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    approved_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=20, default="api")
    note = models.TextField(blank=True, default="")
    digest = models.CharField(max_length=64)
    channel_user = models.CharField(max_length=255, blank=True, default="")

    #: What a caller of ``decide()`` reads of what it returns (a Decision's names).
    verdict = "approved"
    stop = False

    class Meta:
        ordering = ["approved_at", "id"]
        constraints = [models.UniqueConstraint(fields=["tool_call", "approved_by"], name="nexo_approval_once")]

    def __str__(self) -> str:
        return f"approved by {self.approved_by}"

    @property
    def approved(self) -> bool:
        return True

    @property
    def decided_by(self) -> Any:
        return self.approved_by
