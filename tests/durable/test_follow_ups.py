"""``run.follow_up(prompt, user=None)`` (issue 25, point 1): a new run continues a finished run's
conversation; each run keeps its own rows and the earlier ones are read as a prefix. Scripted
models throughout: what the model receives is what the test checks."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from nexo_django import Agent
from nexo_django.core.errors import FollowUpRefused
from nexo_django.durable import conversations
from nexo_django.models import AgentRun, RunEvent, RunMessage, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import approver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


class Chatty(Agent):
    """Scripted: answers, then (a follow-up) writes a note under approve and answers, then (a
    second follow-up) answers again. The script's turn is the conversation's assistant count."""

    model = ScriptedModel([
        reply("Paris."),
        tool_call("write", path="notes.txt", content="Paris"),
        reply("Noted it."),
        reply("You asked about Paris."),
    ])
    instructions = "You answer briefly."
    sandbox = "virtual"
    permissions = "approve"
    max_turns = 2


class Waiter(Agent):
    """Scripted: a gated write first, so the run waits for a decision."""

    model = ScriptedModel([tool_call("write", path="w.txt", content="w"), reply("Written.")])
    sandbox = "virtual"
    permissions = "approve"


class Reuser(Agent):
    """Scripted: the same call id in every run of the conversation."""

    model = ScriptedModel(
        [tool_call("read", path="x"), reply("one"), tool_call("read", path="x"), reply("two")],
        call_ids="toolu_{index}",
    )
    sandbox = "virtual"


@pytest.fixture(autouse=True)
def _fresh_scripts() -> None:
    Chatty.model.requests.clear()
    Waiter.model.requests.clear()


@pytest.fixture
def ann() -> Any:
    return approver()


def _roles(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in messages]


def test_a_follow_up_sends_the_earlier_transcript_then_the_new_prompt_scripted(ann: Any) -> None:
    first = Chatty.run("Capital of France?")
    assert first.status == RunStatus.DONE and first.result == "Paris."
    second = first.follow_up("Write it down.")
    [call] = second.pending_calls()  # the follow-up waits for a decision, like any run
    call.approve(by=ann)
    second.refresh_from_db()
    assert second.status == RunStatus.DONE and second.result == "Noted it."
    sent = Chatty.model.requests[1]["messages"]
    assert _roles(sent) == [
        ("system", "You answer briefly."), ("user", "Capital of France?"), ("assistant", "Paris."),
        ("user", "Write it down."),
    ]
    # the resume inside the follow-up sends the whole conversation again, its own rows after
    resumed = Chatty.model.requests[2]["messages"]
    assert _roles(resumed)[:4] == _roles(sent)
    assert [m["role"] for m in resumed[4:]] == ["assistant", "tool"]
    assert second.previous_id == first.pk and AgentRun.objects.get(pk=first.pk).next_run.pk == second.pk
    # the virtual workspace goes on from the earlier run's files
    assert "notes.txt" in str(AgentRun.objects.get(pk=second.pk).workspace)


def test_each_run_keeps_its_own_rows_and_nothing_is_copied_scripted(ann: Any) -> None:
    first = Chatty.run("Capital of France?")
    rows_before = RunMessage.objects.filter(run=first).count()
    second = first.follow_up("Write it down.", later=False)
    second.pending_calls().get().approve(by=ann)
    third = AgentRun.objects.get(pk=second.pk).follow_up("What did I ask?")
    third.refresh_from_db()
    assert third.result == "You asked about Paris."
    assert RunMessage.objects.filter(run=first).count() == rows_before
    # a follow-up stores its own prompt and reply only, numbered from 0
    assert list(RunMessage.objects.filter(run=third).values_list("seq", "role")) == [(0, "user"), (1, "assistant")]
    assert len(Chatty.model.requests[-1]["messages"]) == 8  # 3 of the first (system included), 4 of the second, the prompt
    assert [r.pk for r in third.conversation()] == [first.pk, second.pk, third.pk]
    assert [r.pk for r in first.conversation()] == [first.pk, second.pk, third.pk]
    created = RunEvent.objects.get(run=third, type="created").data
    assert created["previous"] == str(second.pk) and created["later"] is True


def test_max_turns_and_usage_count_the_follow_ups_own_turns_scripted(ann: Any) -> None:
    first = Chatty.run("Capital of France?")
    second = first.follow_up("Write it down.")
    second.pending_calls().get().approve(by=ann)
    second.refresh_from_db()
    # three assistant turns in the conversation, two of them this run's: within max_turns = 2
    assert second.status == RunStatus.DONE
    assert second.usage["output_tokens"] == 2  # scripted usage: the call, then the text


def test_call_ids_stay_unique_over_the_conversation_scripted() -> None:
    first = Reuser.run("a")
    assert first.status == RunStatus.DONE
    second = first.follow_up("b", later=False)
    assert second.status == RunStatus.DONE and second.result == "two"
    [earlier] = RunMessage.objects.get(run=first, seq=1).data["tool_calls"]
    [call] = RunMessage.objects.get(run=second, seq=1).data["tool_calls"]
    # the model reused the earlier run's id: the follow-up's call is renamed (the model sees both)
    assert earlier["id"] == "toolu_0" and call["id"].startswith("toolu_0_")


@pytest.mark.parametrize("status", ["queued", "running", "needs_attention", "failed"])
def test_a_follow_up_is_refused_while_the_run_can_change_naming_the_state(status: str) -> None:
    run = Chatty.run("Capital of France?")
    AgentRun.objects.filter(pk=run.pk).update(status=status)
    with pytest.raises(FollowUpRefused, match=f"while it is {status}"):
        run.follow_up("again?")
    assert AgentRun.objects.count() == 1


def test_a_follow_up_on_a_run_waiting_for_a_decision_is_refused_scripted() -> None:
    run = Waiter.run("write")
    assert run.status == RunStatus.SUSPENDED
    with pytest.raises(FollowUpRefused, match="while it is suspended: it waits for a decision"):
        run.follow_up("and then?")
    assert len(Waiter.model.requests) == 1 and AgentRun.objects.count() == 1


def test_a_run_is_followed_up_once_scripted() -> None:
    first = Chatty.run("Capital of France?")
    second = first.follow_up("Write it down.")
    second.cancel()
    with pytest.raises(FollowUpRefused, match=f"followed up already \\(by run {second.pk}\\)"):
        first.follow_up("another branch")


def test_two_follow_ups_at_once_make_one_run_and_one_clear_refusal_scripted() -> None:
    first = Chatty.run("Capital of France?")
    barrier = threading.Barrier(2)
    outcomes: list[tuple[str, str]] = []

    def ask(n: int) -> None:
        barrier.wait()
        try:
            outcomes.append(("run", str(first.follow_up(f"Write it down ({n}).", later=False).pk)))
        except FollowUpRefused as exc:
            outcomes.append(("refused", str(exc)))
        except Exception as exc:  # noqa: BLE001 - what must not happen, reported
            outcomes.append(("error", repr(exc)))
        finally:
            connection.close()

    threads = [threading.Thread(target=ask, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(kind for kind, _ in outcomes) == ["refused", "run"], outcomes
    refusal = next(text for kind, text in outcomes if kind == "refused")
    assert "followed up already" in refusal and "last run of the conversation" in refusal
    assert [str(pk) for pk in AgentRun.objects.filter(previous=first).values_list("pk", flat=True)] == [
        text for kind, text in outcomes if kind == "run"]


def test_a_follow_up_stored_by_another_at_the_same_moment_is_refused_with_nothing_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unique link catches what the check cannot see (the other follow-up committed between
    this one's check and its insert): a refusal, never a raw database error, nothing half-stored."""
    first = Chatty.run("Capital of France?")
    store = conversations._store

    def another_one_first(earlier: AgentRun, *args: Any, **kwargs: Any) -> AgentRun:
        AgentRun.objects.create(agent=earlier.agent, prompt="the other", status=RunStatus.DONE, previous=earlier)
        return store(earlier, *args, **kwargs)

    monkeypatch.setattr(conversations, "_store", another_one_first)
    before = (AgentRun.objects.count(), RunMessage.objects.count(), RunEvent.objects.count())
    with pytest.raises(FollowUpRefused, match="followed up already, at the same moment"):
        first.follow_up("Write it down.")
    assert (AgentRun.objects.count(), RunMessage.objects.count(), RunEvent.objects.count()) == before


def test_a_cancelled_run_is_followed_up_with_its_open_call_shown_as_not_run_scripted() -> None:
    waiting = Waiter.run("write")
    waiting.cancel(reason="changed my mind")
    follow = AgentRun.objects.get(pk=waiting.pk).follow_up("never mind, just answer")
    follow.refresh_from_db()
    assert follow.status == RunStatus.DONE and follow.result == "Written."
    sent = Waiter.model.requests[-1]["messages"]
    assert sent[-2]["role"] == "tool" and "not run: its run ended (cancelled)" in sent[-2]["content"]["error"]
    assert sent[-1] == {"role": "user", "content": "never mind, just answer"}
    assert not RunMessage.objects.filter(run=waiting, role="tool").exists()  # given, never stored


def test_bad_input_to_follow_up_is_refused_with_nothing_stored() -> None:
    first = Chatty.run("Capital of France?")
    with pytest.raises(ValueError, match="non-empty string"):
        first.follow_up("  ")
    with pytest.raises(TypeError, match="user must be a user object"):
        first.follow_up("again", user="bob")
    assert AgentRun.objects.count() == 1


def test_the_follow_up_belongs_to_the_user_given(tmp_path: Path) -> None:
    bob = get_user_model().objects.create_user("bob")
    first = Chatty.run("Capital of France?", user=bob)
    second = first.follow_up("Write it down.", user=bob)
    assert second.created_by_id == bob.pk
