"""The Django-facing agent: the core's :class:`~nexo_django.core.agent.Agent`, configured from
``NEXO`` and able to run durably (``run``, ``run_later``).

Importing this module touches no database and needs no configured settings, so
``from nexo_django import Agent`` works in plain Python (``prompt()``), in a project's settings
module and while Django loads its apps. The durable entry points need the app registry (they
store ``AgentRun`` rows), so they reach :mod:`nexo_django.durable.runs` when they are called.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.conf import settings

from ..conf import nexo_settings
from ..core.agent import Agent as CoreAgent
from . import agent_classes

if TYPE_CHECKING:
    from ..models import AgentRun

#: the settings the core agent is built from (:meth:`CoreAgent.configuration`)
AGENT_SETTINGS = ("MODEL", "PROVIDERS", "LIMITS", "PROTECTED_NAMES", "SEARCH_BACKEND", "SHELL")


class Agent(CoreAgent):
    """Declare an agent by subclassing; see docs/agents.md."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        agent_classes.remember(cls)  # found again by its path in this process, even from a shell

    def configuration(self) -> Mapping[str, Any]:
        return nexo_settings.view(AGENT_SETTINGS)  # read once per load of NEXO (an agent is built per drive)

    def setting(self, name: str) -> Any:
        return getattr(settings, name, None) if settings.configured else None

    @classmethod
    def run(cls, prompt: str, *, user: Any = None, **kwargs: Any) -> AgentRun:
        """Durable, synchronous: runs now in this process and returns the ``AgentRun``."""
        return _runs().start_run(cls, prompt, user=user, later=False, **kwargs)

    @classmethod
    def run_later(cls, prompt: str, *, user: Any = None, at: datetime | None = None, **kwargs: Any) -> AgentRun:
        """Durable, enqueued when the current transaction commits; returns the ``AgentRun``. With
        ``at`` (an aware datetime), its job waits in rq's scheduler until then (docs/schedules.md)."""
        return _runs().start_run(cls, prompt, user=user, later=True, at=at, **kwargs)

    @classmethod
    async def arun_later(cls, prompt: str, *, user: Any = None, **kwargs: Any) -> AgentRun:
        """``run_later`` for async views: the database work runs in Django's sync thread (as
        ``sync_to_async`` does for the ORM), the job is sent once it commits."""
        start = _runs().start_run
        run: AgentRun = await sync_to_async(start)(cls, prompt, user=user, later=True, **kwargs)
        return run


def _runs() -> Any:
    # Imported when called, not for a circle (runs does not import this module; the import
    # contract in pyproject.toml checks it) but for the app registry: runs imports the models,
    # which cannot load before Django has, and this module is imported before that.
    from . import runs

    return runs
