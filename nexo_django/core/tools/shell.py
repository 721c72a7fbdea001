"""``shell``: run a command in the workspace, confined by the sandbox (bubblewrap for ``local``,
unless it was built with ``confine=False``): see docs/sandboxes.md."""

from __future__ import annotations

from typing import Any

from ..errors import WorkspaceOverQuota
from .base import Tool, ToolContext


def _shell(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    result = ctx.sandbox.shell(
        args["command"], timeout=ctx.limits.shell_timeout, max_output=ctx.limits.shell_max_output
    )
    if result.get("over_quota"):
        # The command ran and left the workspace over NEXO["LIMITS"]: the run fails here, with the
        # reason and the output kept on the call, before the model can ask for anything else.
        kept = {key: value for key, value in result.items() if key != "over_quota"}
        raise WorkspaceOverQuota(f"shell: {result['over_quota']}; the run is stopped", result=kept)
    return result


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
