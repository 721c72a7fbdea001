"""When a waiting call's approval request ends: its agent's ``approval_timeout`` (or
``NEXO["APPROVAL_TIMEOUT"]``) and ``on_timeout``. The journal reads the deadline when a call
starts waiting; :mod:`nexo_django.durable.expiry` acts on it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from ..conf import as_timedelta, nexo_settings
from ..core.agent import FROM_SETTINGS, ON_TIMEOUT
from . import agent_classes

log = logging.getLogger("nexo_django.expiry")


def timeout_of(agent_cls: type) -> timedelta | None:
    """How long a call of ``agent_cls`` waits for a person (None: forever)."""
    declared = getattr(agent_cls, "approval_timeout", FROM_SETTINGS)
    if declared is FROM_SETTINGS:
        return as_timedelta(nexo_settings.APPROVAL_TIMEOUT, 'NEXO["APPROVAL_TIMEOUT"]')
    return as_timedelta(declared, f"{agent_cls.__name__}.approval_timeout")


def deadline(agent_cls: type, now: datetime) -> datetime | None:
    timeout = timeout_of(agent_cls)
    return None if timeout is None else now + timeout


def on_timeout_of(agent_path: str) -> str:
    """The agent's ``on_timeout``; "deny" when the class cannot be imported any more (the safe
    choice: the call is not run, and the model hears why)."""
    try:
        value = getattr(agent_classes.agent_class(agent_path), "on_timeout", "deny")
    except ImportError:
        log.warning("expiry: cannot import %s; its expired calls are denied", agent_path)
        return "deny"
    return value if value in ON_TIMEOUT else "deny"
