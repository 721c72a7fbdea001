"""Which approval policy routes a call, matched on what the gate sees.

A policy matches a call by ``agent`` (the run's Agent class path exactly, ``""``: any),
``capability`` and ``tool`` (exact, ``""``: any) and ``target``, on the call's normalised target:

- ``read``/``write``: an ``fnmatch`` pattern on the ``/``-rooted path as the gate normalises it
  (:func:`nexo_django.durable.rules.gate_path`, as standing rules match); a call whose path the gate
  cannot normalise is matched by no policy (it fails when it runs, whoever approves it);
- ``shell``: the whole command, exactly (never a prefix: ``git status`` does not match
  ``git status; curl evil``);
- ``fetch``: the URL's host, lowercase, or an ``fnmatch`` pattern of it (``*.example.com``);
- MCP tools: ``"server: tool"`` or a pattern of it (``"github: *"``);
- an empty ``target``: any target (for a path tool, any path the gate can normalise).

Enabled policies are tried by ``order``, then id: the first that matches routes the call.
"""

from __future__ import annotations

import fnmatch
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from ...core.mcp import SEPARATOR
from ...models import ApprovalPolicy, ToolCall
from .. import rules

#: The fields of a policy its history and the calls it routes keep (with its id and groups).
FIELDS = ("name", "order", "agent", "capability", "tool", "target", "quorum", "reviewer", "reviewer_may_deny",
          "enabled")


def said(policy: ApprovalPolicy) -> dict[str, Any]:
    """What ``policy`` says, as JSON: its id, :data:`FIELDS`, its groups (ids and names) and its
    escalation delay in seconds."""
    data: dict[str, Any] = {"id": policy.pk, **{name: getattr(policy, name) for name in FIELDS}}
    data["escalate_after"] = policy.escalate_after.total_seconds() if policy.escalate_after else None
    for field in ("approvers", "escalation_groups"):
        groups = sorted(getattr(policy, field).all(), key=lambda g: g.pk) if policy.pk else []
        data[field] = [g.pk for g in groups]
        data[f"{field}_names"] = [g.name for g in groups]
    return data


def target_of(call: ToolCall) -> str | None:
    """The call's target as a policy's ``target`` is matched against (see the module); None when
    it names none the gate can see (a path the gate cannot normalise, a URL with no host)."""
    args = call.args if isinstance(call.args, dict) else {}
    if call.capability in rules.PATH_CAPABILITIES:
        return rules.gate_path(call.capability, args)
    if call.capability == "shell":
        command = args.get("command")
        return command if isinstance(command, str) else ""  # a tool of the shell capability with no command
    if call.capability == "fetch":
        url = args.get("url")
        try:
            host = urlsplit(url.strip()).hostname if isinstance(url, str) else None
        except ValueError:
            host = None
        return host.lower() if host else None
    if call.capability == "mcp":
        server, name = call.server, call.name
        if not server and SEPARATOR in name:
            server, name = name.split(SEPARATOR, 1)
        return f"{server}: {name}" if server else name
    return ""


def matches(policy: dict[str, Any], call: ToolCall, agent: str) -> bool:
    """Whether the policy (as :func:`said` gives it) matches ``call`` of a run of ``agent``."""
    if not policy.get("enabled") or policy.get("agent") not in ("", agent):
        return False
    if policy.get("capability") not in ("", call.capability) or policy.get("tool") not in ("", call.name):
        return False
    target = target_of(call)
    if target is None:
        return False  # the gate cannot see what it acts on: no policy claims it
    pattern = policy.get("target") or ""
    if not pattern:
        return True
    if call.capability == "shell":
        return bool(target) and target == pattern
    if call.capability == "fetch":
        pattern = pattern.lower()
    return bool(target) and fnmatch.fnmatchcase(target, pattern)


def choose(policies: list[dict[str, Any]], call: ToolCall, agent: str) -> dict[str, Any] | None:
    """The policy that routes ``call``: the first enabled match by ``order``, then id."""
    for policy in sorted(policies, key=lambda p: (p.get("order", 0), p.get("id", 0))):
        if matches(policy, call, agent):
            return policy
    return None


def validate(capability: str, tool: str, target: str) -> None:
    """``ValidationError`` (on ``target``) for a pattern the gate's targets can never match."""
    if not capability and tool in ("read", "write", "shell"):
        capability = rules.capability_of(tool)
    if not target:
        return
    if not capability:
        raise ValidationError({"target": "A target is matched against what one kind of call acts on: choose a "
                                         "capability (or a built-in tool) for it, or leave the target empty."})
    if capability in rules.PATH_CAPABILITIES:
        if not target.startswith(("/", "*")):
            raise ValidationError({"target": f"Paths are matched /-rooted, as the gate normalises them: write "
                                             f"/{target} (or a pattern like /deploy/*)."})
        parts = target.split("/")
        if any(part in (".", "..") for part in parts) or "//" in target:
            raise ValidationError({"target": "The gate normalises every path (no '.', '..' or '//' is left in "
                                             "it), so this pattern could never match: write the path as it "
                                             "resolves, e.g. /deploy/*."})
    elif capability == "fetch":
        if "/" in target or ":" in target:
            raise ValidationError({"target": "A fetch policy matches the URL's host only: write the host "
                                             "(api.example.com) or a pattern (*.example.com), without a scheme, "
                                             "port or path."})
    elif capability == "mcp":
        if ": " not in target:
            raise ValidationError({"target": "An MCP policy matches 'server: tool' (e.g. 'github: create_issue' "
                                             "or 'github: *')."})
    elif capability != "shell":
        raise ValidationError({"target": f"{capability} calls name no target to match; leave it empty."})
