"""The permission gate (DESIGN.md section 3): modes x capabilities, allow, ask, approve, MCP."""

from __future__ import annotations

from typing import Any

import pytest

from nexo_django import ApprovalRequired, Denied, NexoError, Permissions
from nexo_django.core.permissions import CAPABILITIES, MODES, PRIVILEGED

ALLOWED = "allowed"
DENIED = "denied"
PENDING = "pending"


class Recorder:
    """An on_ask callback that answers ``answer`` and remembers what it was asked."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, capability: str, detail: Any) -> bool:
        self.calls.append((capability, detail))
        return self.answer


def outcome(gate: Permissions, capability: str, detail: Any = "x.txt") -> str:
    try:
        result = gate.authorize(capability, detail)
    except ApprovalRequired:
        return PENDING
    except Denied:
        return DENIED
    assert result is True
    return ALLOWED


# --- the matrix: every mode against every capability -------------------------------------

DEFAULT_ALLOW_MATRIX = {
    # mode: (read, glob, write, shell, fetch, search) with the default allow=("read", "glob")
    "read_only": (ALLOWED, ALLOWED, DENIED, DENIED, DENIED, DENIED),
    "auto": (ALLOWED,) * 6,
    "ask": (ALLOWED, ALLOWED, DENIED, DENIED, DENIED, DENIED),  # bare "ask": nobody to ask
    "approve": (ALLOWED, ALLOWED, PENDING, PENDING, PENDING, PENDING),
}

EMPTY_ALLOW_MATRIX = {
    # the same with allow=(): nothing passes on the strength of allow
    "read_only": (DENIED,) * 6,
    "auto": (ALLOWED,) * 6,
    "ask": (DENIED,) * 6,
    "approve": (PENDING,) * 6,
}


def _cases(matrix: dict[str, tuple[str, ...]]) -> list[tuple[str, str, str]]:
    return [(mode, cap, want) for mode, row in matrix.items() for cap, want in zip(CAPABILITIES, row, strict=True)]


def test_matrix_covers_every_mode_and_capability() -> None:
    assert set(DEFAULT_ALLOW_MATRIX) == set(MODES) == set(EMPTY_ALLOW_MATRIX)
    assert CAPABILITIES == ("read", "glob", "write", "shell", "fetch", "search")


@pytest.mark.parametrize(("mode", "capability", "expected"), _cases(DEFAULT_ALLOW_MATRIX))
def test_mode_with_default_allow(mode: str, capability: str, expected: str) -> None:
    assert outcome(Permissions(mode), capability) == expected


@pytest.mark.parametrize(("mode", "capability", "expected"), _cases(EMPTY_ALLOW_MATRIX))
def test_mode_with_empty_allow(mode: str, capability: str, expected: str) -> None:
    assert outcome(Permissions(mode, allow=()), capability) == expected


def test_default_mode_is_read_only_with_read_and_glob() -> None:
    gate = Permissions()
    assert gate.mode == "read_only"
    assert gate.allow == ("read", "glob")


# --- allow is checked first, in every mode -----------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("capability", sorted(PRIVILEGED))
def test_allow_overrides_every_mode(mode: str, capability: str) -> None:
    refuse = Recorder(False)
    # Even a refusing on_ask, a narrowing predicate and a denial on record cannot stop it.
    gate = Permissions(
        mode, allow=(capability,), on_ask=refuse, ask_when=lambda c, d: True, decision=False
    )
    assert gate.authorize(capability, "x") is True
    assert refuse.calls == []


def test_allow_does_not_leak_to_other_capabilities() -> None:
    gate = Permissions("read_only", allow=("write",))
    assert gate.authorize("write", "a.txt") is True
    with pytest.raises(Denied):
        gate.authorize("read", "a.txt")


# --- ask -----------------------------------------------------------------------------------


@pytest.mark.parametrize("capability", sorted(PRIVILEGED))
def test_bare_ask_denies_every_gated_call(capability: str) -> None:
    gate = Permissions.resolve("ask")
    assert gate.on_ask is None
    with pytest.raises(Denied, match="on_ask"):
        gate.authorize(capability, "x")


def test_ask_calls_on_ask_with_capability_and_detail() -> None:
    yes = Recorder(True)
    gate = Permissions("ask", on_ask=yes)
    assert gate.authorize("shell", "ls -la") is True
    assert yes.calls == [("shell", "ls -la")]


def test_ask_refused_denies_and_says_so() -> None:
    no = Recorder(False)
    gate = Permissions("ask", on_ask=no)
    with pytest.raises(Denied) as caught:
        gate.authorize("write", "notes.txt")
    assert no.calls == [("write", "notes.txt")]
    assert caught.value.capability == "write"
    assert caught.value.detail == "notes.txt"
    message = str(caught.value)
    assert "write" in message and "notes.txt" in message and "said no" in message


def test_ask_does_not_ask_for_allowed_capabilities() -> None:
    yes = Recorder(True)
    gate = Permissions("ask", on_ask=yes)
    assert gate.authorize("read", "a.txt") is True
    assert yes.calls == []


# --- ask_when / approve_when ----------------------------------------------------------------


def _python_files(capability: str, detail: Any) -> bool:
    return str(detail).endswith(".py")


def test_ask_when_false_allows_without_asking() -> None:
    yes = Recorder(True)
    gate = Permissions("ask", on_ask=yes, ask_when=_python_files)
    assert gate.authorize("write", "notes.txt") is True
    assert yes.calls == []


def test_ask_when_true_asks() -> None:
    no = Recorder(False)
    gate = Permissions("ask", on_ask=no, ask_when=_python_files)
    with pytest.raises(Denied):
        gate.authorize("write", "app.py")
    assert no.calls == [("write", "app.py")]


def test_ask_when_receives_capability_and_detail() -> None:
    seen: list[tuple[str, Any]] = []

    def predicate(capability: str, detail: Any) -> bool:
        seen.append((capability, detail))
        return False

    Permissions("ask", ask_when=predicate).authorize("fetch", "https://example.com/")
    assert seen == [("fetch", "https://example.com/")]


def test_ask_when_does_not_widen_read_only() -> None:
    gate = Permissions("read_only", ask_when=lambda c, d: False)
    with pytest.raises(Denied):
        gate.authorize("write", "notes.txt")


def test_approve_when_narrows_approve() -> None:
    gate = Permissions("approve", approve_when=_python_files)
    assert gate.authorize("write", "notes.txt") is True
    with pytest.raises(ApprovalRequired):
        gate.authorize("write", "app.py")


def test_approve_when_is_an_alias_of_ask_when() -> None:
    gate = Permissions("approve", approve_when=_python_files)
    assert gate.ask_when is _python_files
    assert gate.approve_when is _python_files
    other = Permissions("ask", ask_when=_python_files)
    assert other.approve_when is _python_files


def test_ask_when_and_approve_when_may_name_the_same_predicate() -> None:
    gate = Permissions("approve", ask_when=_python_files, approve_when=_python_files)
    assert gate.ask_when is _python_files


def test_ask_when_and_approve_when_different_is_an_error() -> None:
    with pytest.raises(ValueError, match="one predicate"):
        Permissions("approve", ask_when=_python_files, approve_when=lambda c, d: True)


# --- approve and decisions ----------------------------------------------------------------


def test_approve_undecided_raises_approval_required_not_denied() -> None:
    with pytest.raises(ApprovalRequired) as caught:
        Permissions("approve").authorize("write", "notes.txt")
    exc = caught.value
    assert not isinstance(exc, Denied)
    assert isinstance(exc, NexoError)
    assert exc.capability == "write"
    assert exc.detail == "notes.txt"
    assert "needs approval" in str(exc)


def test_approval_required_is_not_a_denied_subclass() -> None:
    assert not issubclass(ApprovalRequired, Denied)
    assert not issubclass(Denied, ApprovalRequired)


def test_approve_approved_allows() -> None:
    assert Permissions("approve", decision=True).authorize("shell", "make test") is True


def test_approve_denied_carries_the_note() -> None:
    gate = Permissions("approve", decision={"approved": "no", "note": "not on Fridays"})
    with pytest.raises(Denied) as caught:
        gate.authorize("shell", "make deploy")
    message = str(caught.value)
    assert "not on Fridays" in message
    assert "shell" in message and "make deploy" in message and "approver" in message


def test_approve_denied_without_note() -> None:
    with pytest.raises(Denied, match="denied by the approver"):
        Permissions("approve", decision=False).authorize("write", "a.txt")


@pytest.mark.parametrize(
    ("value", "approved"),
    [
        ("true", True),
        ("false", False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("no", False),
        ("on", True),
        ("off", False),
        (" TRUE ", True),
        ("Off", False),
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ({"approved": "true", "note": "fine"}, True),
        ({"approved": "false", "note": "no"}, False),
        ({"approved": True}, True),
    ],
)
def test_decisions_read_like_form_values(value: Any, approved: bool) -> None:
    gate = Permissions("approve", decision=value)
    assert gate.decision is not None
    assert gate.decision.approved is approved
    assert outcome(gate, "write") == (ALLOWED if approved else DENIED)


def test_decision_note_from_a_mapping() -> None:
    gate = Permissions("approve", decision={"approved": "true", "note": "ok by me"})
    assert gate.decision is not None
    assert gate.decision.note == "ok by me"


@pytest.mark.parametrize("typo", ["ture", "flase", "", "maybe", 2, -1, 0.5, {"approved": "ture"}, {"note": "x"}, [True]])
def test_a_typo_never_reads_as_consent(typo: Any) -> None:
    with pytest.raises(ValueError):
        Permissions("approve", decision=typo)
    with pytest.raises(ValueError):
        Permissions("approve").with_decision(typo)


def test_with_decision_returns_a_copy() -> None:
    gate = Permissions("approve", allow=("read",))
    approved = gate.with_decision("true")
    assert approved is not gate
    assert gate.decision is None
    assert approved.authorize("write", "a.txt") is True
    with pytest.raises(ApprovalRequired):
        gate.authorize("write", "a.txt")
    assert approved.mode == "approve" and approved.allow == ("read",)


def test_with_decision_none_is_undecided_again() -> None:
    gate = Permissions("approve", decision=True).with_decision(None)
    with pytest.raises(ApprovalRequired):
        gate.authorize("write", "a.txt")


# --- resolve, validation --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_resolve_turns_a_mode_name_into_an_instance(mode: str) -> None:
    gate = Permissions.resolve(mode)
    assert isinstance(gate, Permissions)
    assert gate.mode == mode
    assert gate.allow == ("read", "glob")


def test_resolve_none_is_read_only() -> None:
    assert Permissions.resolve(None).mode == "read_only"


def test_resolve_passes_an_instance_through() -> None:
    gate = Permissions("auto")
    assert Permissions.resolve(gate) is gate


@pytest.mark.parametrize("value", ["bogus", "Ask", "readonly", 3])
def test_resolve_rejects_anything_else(value: Any) -> None:
    with pytest.raises(ValueError):
        Permissions.resolve(value)


@pytest.mark.parametrize("mode", ["bogus", "AUTO", "", "approved"])
def test_unknown_mode_is_an_error(mode: str) -> None:
    with pytest.raises(ValueError, match="unknown permission mode"):
        Permissions(mode)


def test_unknown_capability_in_authorize() -> None:
    with pytest.raises(ValueError, match="unknown capability 'delete'"):
        Permissions("auto").authorize("delete", "x")


def test_unknown_capability_in_never_allows() -> None:
    with pytest.raises(ValueError, match="unknown capability"):
        Permissions().never_allows("Write")


def test_unknown_capability_in_allow() -> None:
    with pytest.raises(ValueError, match="unknown capability 'exec'"):
        Permissions("read_only", allow=("read", "exec"))


def test_allow_must_be_a_list_not_a_string() -> None:
    # "write" as a string would otherwise be read as the letters w, r, i, t, e.
    with pytest.raises(ValueError, match="list of names"):
        Permissions("read_only", allow="write")


# --- never_allows --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("capability", CAPABILITIES)
def test_never_allows(mode: str, capability: str) -> None:
    expected = mode == "read_only" and capability in PRIVILEGED
    assert Permissions(mode).never_allows(capability) is expected


def test_never_allows_respects_allow() -> None:
    gate = Permissions("read_only", allow=("read", "glob", "write"))
    assert gate.never_allows("write") is False
    assert gate.never_allows("shell") is True


def test_never_allows_is_false_for_unlisted_reads_under_read_only() -> None:
    # read and glob are not privileged: they are attached and the gate decides at call time.
    gate = Permissions("read_only", allow=())
    assert gate.never_allows("read") is False
    with pytest.raises(Denied):
        gate.authorize("read", "a.txt")


# --- denial messages -------------------------------------------------------------------------


def test_read_only_denial_names_capability_detail_and_reason() -> None:
    with pytest.raises(Denied) as caught:
        Permissions("read_only").authorize("shell", "rm -rf build")
    message = str(caught.value)
    assert "shell" in message
    assert "rm -rf build" in message
    assert "read_only" in message
    assert caught.value.capability == "shell"
    assert caught.value.detail == "rm -rf build"


# --- the MCP axis ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_mcp_listed_name_passes_in_every_mode(mode: str) -> None:
    gate = Permissions(mode, mcp_allow=("get_time",))
    assert gate.authorize_mcp("get_time", {"timezone": "UTC"}) is True


@pytest.mark.parametrize("name", ["Get_time", "GET_TIME", "get_time2", "get_tim", " get_time", "get_time ", "get-time"])
def test_mcp_read_only_matches_exact_names_only(name: str) -> None:
    gate = Permissions("read_only", mcp_allow=("get_time",))
    with pytest.raises(Denied) as caught:
        gate.authorize_mcp(name)
    assert caught.value.capability == "mcp"
    assert name in str(caught.value)


def test_mcp_allow_is_not_a_glob() -> None:
    gate = Permissions("read_only", mcp_allow=("get_*",))
    with pytest.raises(Denied):
        gate.authorize_mcp("get_time")
    assert gate.authorize_mcp("get_*") is True


def test_mcp_read_only_denies_unlisted_and_says_why() -> None:
    with pytest.raises(Denied, match="mcp_allow"):
        Permissions("read_only").authorize_mcp("convert_time", {"time": "12:00"})


def test_mcp_auto_allows_anything() -> None:
    assert Permissions("auto").authorize_mcp("drop_database", {"really": True}) is True


def test_mcp_ask_calls_on_ask_with_tool_and_args() -> None:
    yes = Recorder(True)
    gate = Permissions("ask", on_ask=yes)
    assert gate.authorize_mcp("convert_time", {"time": "12:00"}) is True
    assert yes.calls == [("mcp", {"tool": "convert_time", "args": {"time": "12:00"}})]


def test_mcp_ask_with_no_args_sends_an_empty_mapping() -> None:
    yes = Recorder(True)
    Permissions("ask", on_ask=yes).authorize_mcp("now")
    assert yes.calls == [("mcp", {"tool": "now", "args": {}})]


def test_mcp_ask_refused_denies() -> None:
    no = Recorder(False)
    with pytest.raises(Denied) as caught:
        Permissions("ask", on_ask=no).authorize_mcp("convert_time", {"time": "12:00"})
    assert caught.value.capability == "mcp"
    assert "convert_time" in str(caught.value)


def test_mcp_bare_ask_denies() -> None:
    with pytest.raises(Denied, match="on_ask"):
        Permissions.resolve("ask").authorize_mcp("convert_time")


def test_mcp_ask_does_not_ask_for_listed_names() -> None:
    no = Recorder(False)
    gate = Permissions("ask", on_ask=no, mcp_allow=("get_time",))
    assert gate.authorize_mcp("get_time") is True
    assert no.calls == []


def test_mcp_approve_unlisted_needs_a_decision() -> None:
    gate = Permissions("approve", mcp_allow=("get_time",))
    with pytest.raises(ApprovalRequired) as caught:
        gate.authorize_mcp("convert_time", {"time": "12:00", "to": "Europe/Paris"})
    exc = caught.value
    assert exc.capability == "mcp"
    assert exc.tool_args == {"time": "12:00", "to": "Europe/Paris"}
    assert exc.detail == {"tool": "convert_time", "args": {"time": "12:00", "to": "Europe/Paris"}}


def test_mcp_approve_case_variant_is_not_pre_approved() -> None:
    gate = Permissions("approve", mcp_allow=("get_time",))
    with pytest.raises(ApprovalRequired):
        gate.authorize_mcp("Get_time", {})


def test_mcp_approve_approved_decision_allows() -> None:
    gate = Permissions("approve").with_decision({"approved": "yes"})
    assert gate.authorize_mcp("convert_time", {"time": "12:00"}) is True


def test_mcp_approve_denied_decision_carries_the_note() -> None:
    gate = Permissions("approve").with_decision({"approved": "no", "note": "wrong zone"})
    with pytest.raises(Denied) as caught:
        gate.authorize_mcp("convert_time", {"time": "12:00"})
    assert "wrong zone" in str(caught.value)
    assert "convert_time" in str(caught.value)


def test_mcp_approve_when_narrows() -> None:
    gate = Permissions("approve", approve_when=lambda cap, detail: detail["tool"].startswith("delete_"))
    assert gate.authorize_mcp("list_files", {}) is True
    with pytest.raises(ApprovalRequired):
        gate.authorize_mcp("delete_file", {"path": "a"})


def test_mcp_unknown_mode_fails_closed() -> None:
    gate = Permissions("auto")
    gate.mode = "something_else"  # cannot be built this way; the gate must still fail closed
    with pytest.raises(Denied):
        gate.authorize_mcp("get_time")


def test_authorize_fails_closed_when_the_mode_is_changed_to_an_unknown_value() -> None:
    gate = Permissions("approve")
    gate.mode = "yolo"
    with pytest.raises(Denied, match="unknown mode"):
        gate.authorize("write", "x")
