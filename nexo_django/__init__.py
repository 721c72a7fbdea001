"""nexo_django: run AI agents safely in Django.

Add ``"django_rq"`` and ``"nexo_django"`` to ``INSTALLED_APPS``; declare an :class:`Agent`;
approve gated calls in the admin.
"""

from __future__ import annotations

from .core.agent import Reply
from .core.permissions import Permissions
from .core.tools import Tool, ToolContext, tool
from .durable.agent import Agent
from .durable.workflow import Workflow

# nexo_django.errors gives the core's ConfigurationError Django's ImproperlyConfigured as a base.
from .errors import (
    ApprovalRequired,
    ConfigurationError,
    Denied,
    NexoError,
    SecurityError,
)

__all__ = [
    "Agent",
    "ApprovalRequired",
    "ConfigurationError",
    "Denied",
    "NexoError",
    "Permissions",
    "Reply",
    "SecurityError",
    "Tool",
    "ToolContext",
    "Workflow",
    "tool",
]

__version__ = "0.1.0"
