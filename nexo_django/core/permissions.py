"""The permission gate: *what* tools may do. Pure Python, no Django import.

Modes: ``read_only`` (default), ``auto``, ``ask``, ``approve``. ``allow`` is checked first in every
mode. See docs/permissions.md for the whole table.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApprovalRequired, Denied

CAPABILITIES: tuple[str, ...] = ("read", "glob", "write", "shell", "fetch", "search")
#: Capabilities with effects beyond reading the sandbox.
PRIVILEGED: frozenset[str] = frozenset({"write", "shell", "fetch", "search"})
MODES: tuple[str, ...] = ("read_only", "auto", "ask", "approve")

Predicate = Callable[[str, Any], Any]
OnAsk = Callable[[str, Any], Any]

_TRUE = frozenset({"true", "1", "yes", "y", "on", "approve", "approved"})
_FALSE = frozenset({"false", "0", "no", "n", "off", "deny", "denied"})


@dataclass(frozen=True)
class Verdict:
    """A person's decision on one call, as the gate sees it."""

    approved: bool
    note: str = ""


def parse_bool(value: Any, *, field: str = "approved") -> bool:
    """Read a boolean as a form would post it: ``True``/``False``, ``"true"``/``"false"``,
    ``"1"``/``"0"``, ``"yes"``/``"no"``, ``"on"``/``"off"``, ``"approve"``/``"deny"``
    (case and surrounding blanks ignored). Anything else is a ``ValueError``: a typo must
    never read as consent."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ValueError(f"{field} must be true or false (got {value!r})")


def to_verdict(decision: Any) -> Verdict | None:
    """Normalise a decision: ``None`` (undecided), a bool or form string, a mapping with an
    ``approved`` key and optional ``note``, or an object with ``approved``/``note`` attributes."""
    if decision is None or isinstance(decision, Verdict):
        return decision
    if isinstance(decision, Mapping):
        if "approved" not in decision:
            raise ValueError('a decision mapping needs an "approved" key, e.g. {"approved": True}')
        return Verdict(parse_bool(decision["approved"]), str(decision.get("note") or ""))
    if isinstance(decision, (bool, str, int)):
        return Verdict(parse_bool(decision))
    if hasattr(decision, "approved"):
        return Verdict(parse_bool(decision.approved), str(getattr(decision, "note", "") or ""))
    raise ValueError(f"cannot read a decision from {decision!r}")


def _check_capability(capability: str) -> None:
    if capability not in CAPABILITIES:
        raise ValueError(
            f"unknown capability {capability!r}; expected one of {', '.join(CAPABILITIES)}"
        )


def _describe(capability: str, detail: Any) -> str:
    return f"{capability} {detail!r}" if detail is not None else capability


class Permissions:
    """Decides each tool call: ``authorize`` returns ``True`` or raises ``Denied`` /
    ``ApprovalRequired``."""

    def __init__(
        self,
        mode: str = "read_only",
        *,
        allow: Iterable[str] = ("read", "glob"),
        mcp_allow: Iterable[str] = (),
        on_ask: OnAsk | None = None,
        ask_when: Predicate | None = None,
        approve_when: Predicate | None = None,
        decision: Any = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown permission mode {mode!r}; expected one of {', '.join(MODES)}")
        if isinstance(allow, str) or isinstance(mcp_allow, str):
            raise ValueError("allow and mcp_allow take a list of names, not a single string")
        allow = tuple(allow)
        for capability in allow:
            _check_capability(capability)
        if ask_when is not None and approve_when is not None and ask_when is not approve_when:
            raise ValueError("ask_when and approve_when are one predicate: pass only one of them")
        self.mode = mode
        self.allow: tuple[str, ...] = allow
        self.mcp_allow: tuple[str, ...] = tuple(mcp_allow)
        self.on_ask = on_ask
        self.ask_when: Predicate | None = ask_when if ask_when is not None else approve_when
        self.decision: Verdict | None = to_verdict(decision)

    @property
    def approve_when(self) -> Predicate | None:
        return self.ask_when

    def __repr__(self) -> str:
        return f"Permissions(mode={self.mode!r}, allow={self.allow!r}, mcp_allow={self.mcp_allow!r})"

    @classmethod
    def resolve(cls, value: Permissions | str | None) -> Permissions:
        """A mode name (``"ask"``) becomes an instance; an instance is returned as is."""
        if value is None:
            return cls()
        if isinstance(value, Permissions):
            return value
        if isinstance(value, str):
            return cls(value)
        raise ValueError(f"permissions must be a mode name or a Permissions instance, not {value!r}")

    def with_decision(self, decision: Any) -> Permissions:
        clone = copy.copy(self)
        clone.decision = to_verdict(decision)
        return clone

    def never_allows(self, capability: str) -> bool:
        """True when no call of this capability can ever pass: its tool is not attached."""
        _check_capability(capability)
        return self.mode == "read_only" and capability in PRIVILEGED and capability not in self.allow

    def _needs_asking(self, capability: str, detail: Any) -> bool:
        return self.ask_when is None or bool(self.ask_when(capability, detail))

    def authorize(self, capability: str, detail: Any = None) -> bool:
        _check_capability(capability)
        if capability in self.allow:
            return True
        what = _describe(capability, detail)
        if self.mode == "auto":
            return True
        if self.mode == "read_only":
            raise Denied(
                f"{what} denied: the read_only mode allows only {', '.join(self.allow) or 'nothing'}",
                capability=capability,
                detail=detail,
            )
        if self.mode not in MODES:
            raise Denied(f"{what} denied: unknown mode {self.mode!r}", capability=capability, detail=detail)
        if not self._needs_asking(capability, detail):
            return True
        if self.mode == "ask":
            return self._ask(capability, detail, what)
        if self.mode == "approve":
            return self._decided(capability, detail, what, args=None)
        raise Denied(f"{what} denied: unknown mode {self.mode!r}", capability=capability, detail=detail)

    def authorize_mcp(self, tool_name: str, args: Mapping[str, Any] | None = None) -> bool:
        """The second axis: MCP tools run inside their server, outside the sandbox."""
        detail = {"tool": tool_name, "args": dict(args or {})}
        what = f"MCP tool {tool_name!r}"
        if self.mode == "auto":
            return True
        # Exact, case-sensitive names only: no globbing, no normalisation.
        listed = tool_name in self.mcp_allow
        if self.mode == "read_only":
            if listed:
                return True
            raise Denied(
                f"{what} denied: the read_only mode allows only MCP tools named in mcp_allow",
                capability="mcp",
                detail=detail,
            )
        if self.mode == "ask":
            if listed or not self._needs_asking("mcp", detail):
                return True
            return self._ask("mcp", detail, what)
        if self.mode == "approve":
            if listed or not self._needs_asking("mcp", detail):
                return True
            return self._decided("mcp", detail, what, args=detail["args"])
        raise Denied(f"{what} denied: unknown mode {self.mode!r}", capability="mcp", detail=detail)

    def _ask(self, capability: str, detail: Any, what: str) -> bool:
        if self.on_ask is None:
            raise Denied(
                f"{what} denied: the ask mode has no on_ask callback to ask with",
                capability=capability,
                detail=detail,
            )
        if self.on_ask(capability, detail):
            return True
        raise Denied(f"{what} denied: the person asked said no", capability=capability, detail=detail)

    def _decided(self, capability: str, detail: Any, what: str, *, args: Any) -> bool:
        if self.decision is None:
            raise ApprovalRequired(capability, detail, args=args)
        if self.decision.approved:
            return True
        reason = f": {self.decision.note}" if self.decision.note else ""
        raise Denied(
            f"{what} denied by the approver{reason}", capability=capability, detail=detail
        )
