"""``shell``: run a command in the workspace. Not a sandbox: see docs/sandboxes.md."""

from __future__ import annotations

from typing import Any

from .base import Tool, ToolContext


def _shell(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return ctx.sandbox.shell(
        args["command"], timeout=ctx.limits.shell_timeout, max_output=ctx.limits.shell_max_output
    )


SHELL = Tool(
    "shell",
    "Run a shell command in the workspace folder (no stdin, a minimal environment, a timeout).",
    {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
    capability="shell",
    idempotent=False,
    run=_shell,
    detail=lambda args: args.get("command"),
)
