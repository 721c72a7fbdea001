"""Standing rules: which :class:`~nexo_django.models.ApprovalRule` decides a call that would wait
for a person.

A rule only ever sees calls the gate left undecided (``approve`` mode, not pre-approved): a call
the gate allows or denies on its own never gets here, so a rule cannot widen what the gate allows.
Matching, for an enabled rule whose ``expires_at`` has not passed:

- ``agent``: the run's Agent class path exactly, or ``""`` for any agent;
- ``tool``: the tool name exactly (case-sensitive, MCP qualified names too);
- ``path``: for ``read``/``write``, an ``fnmatch`` pattern (case-sensitive) on the normalised,
  ``/``-rooted path the gate sees (``notes/./a.txt`` is ``/notes/a.txt``), ``""`` for any path;
  for ``shell``, the whole command, compared exactly: never a prefix or a pattern (``git status``
  does not match ``git status; curl evil``), and a shell rule with no command matches nothing;
  for any other tool the rule must leave it empty.

When several rules match, ``denied`` beats ``approved`` (then the oldest rule).

The approval cycle should not pay a query for rules nobody wrote: a process remembers for
``NEGATIVE_SECONDS`` that no enabled rule names a tool (never that one does: a rule disabled a
moment ago is never applied). Saving or deleting a rule in this process forgets it at once
(``AppConfig.ready`` wires it); another process sees a new rule within those seconds. With
``NEXO["SELF_APPROVAL"]`` off, a rule does not approve the calls of runs one of its authors started
(its creator, or anyone who ever changed it: :mod:`~nexo_django.durable.rule_history`): a rule
decides on its authors' behalf, and four eyes means a second person.

A path tool's call whose path the gate cannot normalise is decided by no rule, allow or deny: it
goes to a person. Among the rules that match the normalised path, ``denied`` always wins.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError

from ..conf import nexo_settings
from ..core.errors import SecurityError
from ..core.sandboxes.base import normalize_relative
from ..models import ApprovalRule, ToolCall, Verdict
from . import rule_history, sql

PATH_CAPABILITIES = frozenset({"read", "write"})
NEGATIVE_SECONDS = 5.0
#: tool name -> monotonic time until which "no enabled rule names it" is taken as known here
_none_until: dict[str, float] = {}


def forget(**kwargs: Any) -> None:
    """A rule was saved or deleted: look again next time (a signal receiver)."""
    _none_until.clear()


def _rules_for(tool: str) -> list[ApprovalRule]:
    now = time.monotonic()
    if _none_until.get(tool, 0.0) > now:
        return []
    found = sql.select(ApprovalRule, enabled=True, tool=tool)
    if not found:
        _none_until[tool] = now + NEGATIVE_SECONDS
    return found


def gate_path(capability: str, args: Any) -> str | None:
    """The ``/``-rooted path a path tool's call names, as the gate sees it; None for other calls
    (and for a path the sandbox refuses: no rule decides a call that fails when it runs)."""
    if capability not in PATH_CAPABILITIES or not isinstance(args, dict) or not isinstance(args.get("path"), str):
        return None
    try:
        return "/" + normalize_relative(args["path"])
    except SecurityError:
        return None


def decidable(call: ToolCall) -> bool:
    """Whether any rule may decide ``call``: not a path tool's call whose path the gate cannot
    normalise (``x/../secret/key``, absolute, ``~``, NUL...). Such a call goes to a person: an
    "any path" allow rule would approve what a deny rule's pattern cannot see."""
    return call.capability not in PATH_CAPABILITIES or gate_path(call.capability, call.args) is not None


def matches(rule: ApprovalRule, call: ToolCall, agent: str, now: datetime) -> bool:
    if not rule.enabled or (rule.expires_at is not None and rule.expires_at <= now):
        return False
    if rule.tool != call.name or rule.agent not in ("", agent):
        return False
    if call.capability == "shell":
        command = call.args.get("command") if isinstance(call.args, dict) else None
        return bool(rule.path) and isinstance(command, str) and rule.path == command
    if call.capability in PATH_CAPABILITIES:
        # The normalised path first, for every rule (an "any path" one too): no path, no rule.
        path = gate_path(call.capability, call.args)
        return path is not None and (not rule.path or fnmatch.fnmatchcase(path, rule.path))
    return not rule.path


def choose(
    calls: Iterable[ToolCall], agent: str, now: datetime, *, starter_id: Any = None
) -> dict[int, ApprovalRule]:
    """The rule that decides each call that has one, by call pk. One query per tool named.
    ``starter_id``: the user who started the run (see self-approval above)."""
    calls = list(calls)
    candidates: list[ApprovalRule] = []
    for tool in sorted({c.name for c in calls}):
        candidates += _rules_for(tool)
    if candidates and starter_id is not None and not nexo_settings.SELF_APPROVAL:
        # Its creator, its last editor and everyone who ever changed it are its authors.
        candidates = [r for r in candidates if r.verdict == Verdict.DENIED
                      or starter_id not in (r.created_by_id, r.changed_by_id)]
        edited = rule_history.authored_by(starter_id, [r.pk for r in candidates if r.verdict != Verdict.DENIED])
        candidates = [r for r in candidates if r.pk not in edited]
    if not candidates:
        return {}
    chosen: dict[int, ApprovalRule] = {}
    for call in calls:
        if not decidable(call):
            continue
        found = sorted(
            (r for r in candidates if matches(r, call, agent, now)),
            key=lambda r: (r.verdict != Verdict.DENIED, r.pk),
        )
        if found:
            chosen[call.pk] = found[0]
    return chosen


def suggested_path(call: ToolCall, args: Any = None) -> str:
    """What the decision page offers for "always allow": the call's folder (``/notes/*``), the
    exact command of a shell call, nothing for other tools. ``args``: the call's arguments, or
    the part of them a page loaded (``path``, ``command``), instead of ``call.args``."""
    if args is None:
        args = call.args
    if call.capability == "shell":
        command = args.get("command") if isinstance(args, dict) else None
        return command if isinstance(command, str) else ""
    path = gate_path(call.capability, args)
    if path is None:
        return ""
    folder = path.rsplit("/", 1)[0]
    return f"{folder}/*" if folder else path


def validate(tool: str, capability: str, path: str) -> None:
    """``ValidationError`` for a rule that could never match as written."""
    if capability == "shell" and not path:
        raise ValidationError({"path": "A shell rule names the whole command it allows or denies, exactly; "
                                       "an empty one would match nothing."})
    if capability in PATH_CAPABILITIES and path and not path.startswith(("/", "*")):
        raise ValidationError({"path": f"Paths are matched /-rooted: write /{path} (or a pattern like /notes/*)."})
    if capability not in PATH_CAPABILITIES and capability != "shell" and path:
        raise ValidationError({"path": f"{tool} has no path to match; leave it empty."})


def capability_of(tool: str) -> str:
    """The capability of a built-in tool name (others: their own name, matched without a path)."""
    return {"read": "read", "write": "write", "shell": "shell"}.get(tool, tool)
