from __future__ import annotations

from django.apps import AppConfig


class NexoDjangoConfig(AppConfig):
    name = "nexo_django"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only wiring: system checks register on import. No database, no Redis.
        from . import checks  # noqa: F401
