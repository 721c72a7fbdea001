"""nexo_django: run AI agents safely in Django.

Add ``"django_rq"`` and ``"nexo_django"`` to ``INSTALLED_APPS``; declare an :class:`Agent`;
approve gated calls in the admin.
"""

from __future__ import annotations

from .agent import Agent, Reply
from .errors import (
    ApprovalRequired,
    ConfigurationError,
    Denied,
    NexoError,
    SecurityError,
)
from .permissions import Permissions
from .tools import Tool, ToolContext, tool

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
    "tool",
]

__version__ = "0.1.0"
