"""Standing rules: what they match, which wins, and that they never widen the gate (scripted agents)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from nexo_django.durable import rules
from nexo_django.models import ApprovalRule, CallStatus, Decision, RunStatus, ToolCall, Verdict
from nexo_django.signals import approval_requested
from tests.durable_agents import Scribe
from tests.lifecycle_agents import AskedNobody, SelfAllowed, TwoWrites

NOW = timezone.now()
AGENT = "tests.durable_agents.Scribe"


def call(name: str, capability: str, **args: Any) -> ToolCall:
    return ToolCall(name=name, capability=capability, args=args, agent=AGENT)


def rule(tool: str, path: str = "", **fields: Any) -> ApprovalRule:
    return ApprovalRule(tool=tool, path=path, **fields)


# --- matching (no database) ----------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("/notes/*", "notes/a.txt", True),
    ("/notes/*", "notes/./deep//b.md", True),  # the normalised path the gate sees
    ("/notes/*", "secrets/a.txt", False),
    ("/notes/*", "notes-evil/a.txt", False),
    ("/Notes/*", "notes/a.txt", False),  # case-sensitive
    ("/*.md", "README.md", True),
    ("", "anything/at/all.txt", True),
    ("/notes/*", "../notes/a.txt", False),  # a path the sandbox refuses is matched by nothing
])
def test_path_rules_match_the_rooted_normalised_path(pattern: str, path: str, expected: bool) -> None:
    assert rules.matches(rule("write", pattern), call("write", "write", path=path, content="x"), AGENT, NOW) is expected


@pytest.mark.parametrize(("command", "expected"), [
    ("git status", True),
    ("git status; curl http://evil.example", False),
    ("git status && rm -rf /", False),
    ("git status ", False),
    ("git", False),
    ("git statu", False),
])
def test_shell_rules_match_the_whole_command_exactly(command: str, expected: bool) -> None:
    assert rules.matches(rule("shell", "git status"), call("shell", "shell", command=command), AGENT, NOW) is expected


def test_a_shell_rule_without_a_command_matches_nothing() -> None:
    assert not rules.matches(rule("shell", ""), call("shell", "shell", command="ls"), AGENT, NOW)


def test_tools_without_a_path_match_only_rules_without_one() -> None:
    fetch = call("fetch", "fetch", url="https://example.com/")
    assert rules.matches(rule("fetch"), fetch, AGENT, NOW)
    assert not rules.matches(rule("fetch", "/notes/*"), fetch, AGENT, NOW)


def test_tool_names_match_exactly_mcp_names_too() -> None:
    mcp = call("files.delete", "mcp", target="x")
    assert rules.matches(rule("files.delete"), mcp, AGENT, NOW)
    assert not rules.matches(rule("files.Delete"), mcp, AGENT, NOW)
    assert not rules.matches(rule("files"), mcp, AGENT, NOW)


def test_the_agent_matches_exactly_or_any() -> None:
    write = call("write", "write", path="a.txt", content="")
    assert rules.matches(rule("write", agent=""), write, AGENT, NOW)
    assert rules.matches(rule("write", agent=AGENT), write, AGENT, NOW)
    assert not rules.matches(rule("write", agent="tests.durable_agents.Scrib"), write, AGENT, NOW)


def test_disabled_and_expired_rules_match_nothing() -> None:
    write = call("write", "write", path="a.txt", content="")
    assert not rules.matches(rule("write", enabled=False), write, AGENT, NOW)
    assert not rules.matches(rule("write", expires_at=NOW - timedelta(seconds=1)), write, AGENT, NOW)
    assert rules.matches(rule("write", expires_at=NOW + timedelta(hours=1)), write, AGENT, NOW)


def test_the_decision_page_suggests_the_folder_or_the_exact_command() -> None:
    assert rules.suggested_path(call("write", "write", path="notes/a.txt")) == "/notes/*"
    assert rules.suggested_path(call("write", "write", path="a.txt")) == "/a.txt"
    assert rules.suggested_path(call("shell", "shell", command="make test")) == "make test"
    assert rules.suggested_path(call("fetch", "fetch", url="u")) == ""


# --- deciding durable runs -----------------------------------------------------------------------


@pytest.fixture
def requested() -> Any:
    seen: list[str] = []

    def receiver(sender: Any, tool_call: ToolCall, **kwargs: Any) -> None:
        seen.append(tool_call.tool_call_id)

    approval_requested.connect(receiver)
    yield seen
    approval_requested.disconnect(receiver)


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_an_approve_rule_decides_at_once(tmp_path: Path, requested: list[str]) -> None:
    allow = ApprovalRule.objects.create(agent=Scribe.path(), tool="write", path="/notes.txt", note="notes are fine")
    run = Scribe.run("write hi", cwd=tmp_path)
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    decision = Decision.objects.get()
    assert (decision.verdict, decision.source, decision.rule, decision.decided_by) == ("approved", "rule", allow, None)
    assert decision.note == "notes are fine"
    assert requested == []  # nobody was asked


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_deny_beats_approve(tmp_path: Path) -> None:
    ApprovalRule.objects.create(tool="write")
    deny = ApprovalRule.objects.create(tool="write", path="/*.txt", verdict=Verdict.DENIED, note="no text files")
    ApprovalRule.objects.create(tool="write", path="/notes.txt")
    run = Scribe.run("write hi", cwd=tmp_path)
    assert run.status == RunStatus.DONE
    assert not (tmp_path / "notes.txt").exists()
    assert Decision.objects.get().rule == deny
    told = [m["content"] for m in run.transcript() if m["role"] == "tool"]
    assert told == [{"error": "write denied by a standing rule: no text files"}]


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_disabled_and_expired_rules_leave_the_call_to_a_person(tmp_path: Path, requested: list[str]) -> None:
    ApprovalRule.objects.create(tool="write", enabled=False)
    ApprovalRule.objects.create(tool="write", expires_at=timezone.now() - timedelta(minutes=1))
    run = Scribe.run("write hi", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    assert not Decision.objects.exists()
    assert requested == [run.pending_calls().get().tool_call_id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_a_rule_never_allows_what_the_gate_denies(tmp_path: Path) -> None:
    ApprovalRule.objects.create(tool="write")
    run = AskedNobody.run("write", cwd=tmp_path)
    assert run.status == RunStatus.DONE
    assert not (tmp_path / "notes").exists()
    assert not Decision.objects.exists()
    assert "error" in [m for m in run.transcript() if m["role"] == "tool"][0]["content"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_a_rule_never_touches_what_the_gate_allows(tmp_path: Path) -> None:
    ApprovalRule.objects.create(tool="write", verdict=Verdict.DENIED)
    run = SelfAllowed.run("write", cwd=tmp_path)
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes" / "a.txt").read_text() == "hi"
    assert not Decision.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_only_the_matching_call_of_a_turn_is_decided(tmp_path: Path, requested: list[str]) -> None:
    ApprovalRule.objects.create(agent=TwoWrites.path(), tool="write", path="/notes/*")
    run = TwoWrites.run("two", cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED
    ruled = Decision.objects.get()
    assert ruled.tool_call.args["path"] == "notes/a.txt" and ruled.source == "rule"
    waiting = run.pending_calls().get()
    assert waiting.args["path"] == "secrets/b.txt"
    assert requested == [waiting.tool_call_id]
    waiting.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes" / "a.txt").read_text() == "A" and (tmp_path / "secrets" / "b.txt").read_text() == "B"
    assert ToolCall.objects.filter(run=run, status=CallStatus.SUCCEEDED).count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_a_rule_saved_after_a_lookup_found_none_applies_at_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert Scribe.run("first", cwd=tmp_path / "a").status == RunStatus.SUSPENDED  # remembered: no write rule
    ApprovalRule.objects.create(tool="write")
    assert Scribe.run("second", cwd=tmp_path / "b").status == RunStatus.DONE


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_a_rule_disabled_a_moment_ago_is_never_applied(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    allow = ApprovalRule.objects.create(tool="write")
    assert Scribe.run("first", cwd=tmp_path / "a").status == RunStatus.DONE
    ApprovalRule.objects.filter(pk=allow.pk).update(enabled=False)  # no signal: only the database knows
    assert Scribe.run("second", cwd=tmp_path / "b").status == RunStatus.SUSPENDED
