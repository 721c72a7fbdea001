"""The built-in tools and the :func:`tool` decorator for a project's own."""

from __future__ import annotations

from .base import Limits, Tool, ToolContext, ToolResult, error, tool
from .files import GLOB, READ, WRITE
from .shell import SHELL
from .web import FETCH, SEARCH

#: In the order the model sees them.
BUILTIN: tuple[Tool, ...] = (READ, GLOB, WRITE, SHELL, FETCH, SEARCH)

__all__ = [
    "BUILTIN",
    "FETCH",
    "GLOB",
    "READ",
    "SEARCH",
    "SHELL",
    "WRITE",
    "Limits",
    "Tool",
    "ToolContext",
    "ToolResult",
    "error",
    "tool",
]
