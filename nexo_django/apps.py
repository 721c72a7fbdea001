from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class NexoDjangoConfig(AppConfig):
    name = "nexo_django"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only wiring: system checks register on import, the models get the durable layer's
        # operations, and a saved or deleted standing rule is looked up again. No database, no
        # Redis. Imported here, not at the top: this module loads before the models can
        # (Django's app loading order), and these imports load models.
        from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

        from . import checks  # noqa: F401
        from .durable import rule_history
        from .durable.operations import DurableOperations
        from .durable.policy import history as policy_history
        from .durable.rules import forget
        from .models import ApprovalPolicy, ApprovalRule, install_operations

        install_operations(DurableOperations())
        for signal in (post_save, post_delete):
            signal.connect(forget, sender=ApprovalRule, dispatch_uid=f"nexo_django.rules.forget.{signal is post_save}")
        # Every change of a rule is recorded: who, when, before and after (durable.rule_history).
        pre_save.connect(rule_history.before_save, sender=ApprovalRule, dispatch_uid="nexo_django.rules.before_save")
        post_save.connect(rule_history.after_save, sender=ApprovalRule, dispatch_uid="nexo_django.rules.after_save")
        post_delete.connect(rule_history.after_delete, sender=ApprovalRule, dispatch_uid="nexo_django.rules.after_delete")
        # And every change of an approval policy, its groups too (durable.policy.history).
        pre_save.connect(policy_history.before_save, sender=ApprovalPolicy, dispatch_uid="nexo_django.policy.before_save")
        post_save.connect(policy_history.after_save, sender=ApprovalPolicy, dispatch_uid="nexo_django.policy.after_save")
        post_delete.connect(policy_history.after_delete, sender=ApprovalPolicy, dispatch_uid="nexo_django.policy.after_delete")
        for field in ("approvers", "escalation_groups"):
            m2m_changed.connect(policy_history.groups_changed, sender=getattr(ApprovalPolicy, field).through,
                                dispatch_uid=f"nexo_django.policy.groups.{field}")
        # The reviewer agent is sent the admin's preview of a call (durable.policy.reviewer),
        # imported when a review first needs it: importing the admin here would need every app
        # it uses (auth, contenttypes) installed, and a project without the admin has none.
        from .durable.policy import reviewer

        reviewer.install(_admin_preview)


def _admin_preview(*args: Any, **kwargs: Any) -> Any:
    from .admin.previews import preview_text

    return preview_text(*args, **kwargs)
