from __future__ import annotations

from django.apps import AppConfig


class NexoDjangoConfig(AppConfig):
    name = "nexo_django"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only wiring: system checks register on import. No database, no Redis.
        from django.db.models.signals import post_delete, post_save

        from . import checks  # noqa: F401
        from .models import ApprovalRule
        from .rules import forget

        for signal in (post_save, post_delete):
            signal.connect(forget, sender=ApprovalRule, dispatch_uid=f"nexo_django.rules.forget.{signal is post_save}")
