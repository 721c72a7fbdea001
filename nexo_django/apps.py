from __future__ import annotations

from django.apps import AppConfig


class NexoDjangoConfig(AppConfig):
    name = "nexo_django"
    verbose_name = "Agents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only wiring: system checks register on import, and the models get the durable layer's
        # operations. No database, no Redis. Imported here, not at the top: this module loads
        # before the models can (Django's app loading order), and both imports load models.
        from . import checks  # noqa: F401
        from .durable.operations import DurableOperations
        from .models import install_operations

        install_operations(DurableOperations())
