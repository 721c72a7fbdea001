"""The decision page of the approval inbox, through Django's test client (scripted agents)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nexo_django.display import json_for_editor
from nexo_django.models import CallStatus, Decision, RunEvent, RunStatus, ToolCall, args_digest
from tests.admin.support import (
    INBOX,
    approver,
    client_for,
    csrf_post,
    decision_url,
    page_digest,
    viewer,
)
from tests.durable_agents import ParallelScribe, Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture
def ann() -> Any:
    return approver()


@pytest.fixture
def scribe_call(tmp_path: Path) -> ToolCall:
    run = Scribe.run("write hi", cwd=tmp_path)
    [call] = run.pending_calls()
    return call


def decide(client: Any, call: ToolCall, action: str, **data: Any) -> Any:
    page = client.get(decision_url(call))
    return csrf_post(client, decision_url(call), {"action": action, "digest": page_digest(page.content.decode()), **data})


def test_decision_page_shows_arguments_and_buttons(ann: Any, scribe_call: ToolCall) -> None:
    response = client_for(ann).get(decision_url(scribe_call))
    html = response.content.decode()
    assert response.status_code == 200
    assert "notes.txt" in html and "&quot;content&quot;: &quot;hi&quot;" in html
    for button in ('value="approve"', 'value="deny"', 'value="deny_stop"'):
        assert button in html
    # The editor is a page of its own: the decision form never posts the arguments.
    assert 'value="review_edit"' not in html and 'name="edited_args"' not in html
    assert f'href="{decision_url(scribe_call).replace("/change/", "/edit/")}"' in html
    assert page_digest(html) == scribe_call.digest
    assert "write hi" in html  # the transcript


def test_scripted_approve_runs_the_call_and_finishes_the_run(ann: Any, scribe_call: ToolCall, tmp_path: Path) -> None:
    client = client_for(ann)
    response = decide(client, scribe_call, "approve", note="fine")
    assert response.status_code == 302 and response["Location"] == INBOX
    run = scribe_call.run
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    decision = Decision.objects.get(tool_call=scribe_call)
    assert (decision.verdict, decision.decided_by, decision.note, decision.source) == ("approved", ann, "fine", "admin")
    assert decision.digest == scribe_call.digest
    followed = client.get(response["Location"]).content.decode()
    assert f"/admin/nexo_django/agentrun/{run.pk}/change/" in followed and "is done" in followed


def test_scripted_deny_with_note_reaches_the_model(ann: Any, scribe_call: ToolCall, tmp_path: Path) -> None:
    decide(client_for(ann), scribe_call, "deny", note="not today")
    run = scribe_call.run
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert not (tmp_path / "notes.txt").exists()
    tool_messages = [m for m in run.transcript() if m["role"] == "tool"]
    assert tool_messages[-1]["content"] == {"error": "write denied by the approver: not today"}


def test_scripted_deny_and_stop_cancels_the_run(ann: Any, scribe_call: ToolCall, tmp_path: Path) -> None:
    decide(client_for(ann), scribe_call, "deny_stop", note="stop it")
    run = scribe_call.run
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert Decision.objects.get(tool_call=scribe_call).stop is True
    assert not (tmp_path / "notes.txt").exists()


def test_decision_moves_to_the_next_pending_call_of_the_run(ann: Any, tmp_path: Path) -> None:
    run = ParallelScribe.run("two", cwd=tmp_path)
    first, second = run.pending_calls()
    client = client_for(ann)
    page = client.get(decision_url(first)).content.decode()
    assert decision_url(second) in page  # "other pending calls of the same run"
    response = decide(client, first, "approve")
    assert response["Location"] == decision_url(second)
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED  # still waits for the second call


def test_get_never_decides(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    client.get(decision_url(scribe_call) + "?action=approve&digest=" + scribe_call.digest)
    client.head(decision_url(scribe_call) + "?action=approve")
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.exists()


def test_post_without_csrf_token_is_refused(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    response = client.post(decision_url(scribe_call), {"action": "approve", "digest": scribe_call.digest})
    assert response.status_code == 403
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL


def test_staff_without_permission_gets_403_and_nothing_changes(scribe_call: ToolCall, tmp_path: Path) -> None:
    client = client_for(viewer())
    page = client.get(decision_url(scribe_call))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'value="approve"' not in html and "read-only" in html
    for action in ("approve", "deny", "deny_stop"):
        response = csrf_post(client, decision_url(scribe_call), {"action": action, "digest": scribe_call.digest})
        assert response.status_code == 403
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.exists() and not (tmp_path / "notes.txt").exists()


def test_plain_staff_see_the_call_but_cannot_decide(scribe_call: ToolCall) -> None:
    from tests.admin.support import make_user

    client = client_for(make_user("plain"))
    page = client.get(decision_url(scribe_call))
    assert page.status_code == 200 and 'value="approve"' not in page.content.decode()
    assert csrf_post(client, decision_url(scribe_call), {"action": "approve", "digest": scribe_call.digest}).status_code == 403
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()


def test_stale_digest_is_refused(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    stale = args_digest({"path": "notes.txt", "content": "something else"})
    response = csrf_post(client, decision_url(scribe_call), {"action": "approve", "digest": stale})
    assert response.status_code == 302 and response["Location"] == decision_url(scribe_call)
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL
    assert "not the ones you saw" in client.get(response["Location"]).content.decode()


def test_missing_digest_is_refused(ann: Any, scribe_call: ToolCall) -> None:
    response = csrf_post(client_for(ann), decision_url(scribe_call), {"action": "approve"})
    assert response.status_code == 200
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL


def test_scripted_double_submit_decides_once(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    data = {"action": "approve", "digest": scribe_call.digest}
    first = csrf_post(client, decision_url(scribe_call), data)
    second = csrf_post(client, decision_url(scribe_call), {**data, "action": "deny"})
    assert first.status_code == second.status_code == 302
    assert Decision.objects.count() == 1 and Decision.objects.get().verdict == "approved"
    assert RunEvent.objects.filter(run=scribe_call.run, type="decision").count() == 1
    assert "no longer waiting" in client.get(second["Location"]).content.decode()


# --- edited arguments ----------------------------------------------------------------------------------


def edited(**args: Any) -> str:
    return json.dumps(args)


def test_edit_shows_the_diff_before_anything_is_decided(ann: Any, scribe_call: ToolCall) -> None:
    response = decide(client_for(ann), scribe_call, "review_edit", edited_args=edited(path="notes.txt", content="bye"))
    html = response.content.decode()
    assert response.status_code == 200
    assert 'class="del">-  &quot;content&quot;: &quot;hi&quot;' in html
    assert 'class="add">+  &quot;content&quot;: &quot;bye&quot;' in html
    assert 'name="edited_digest" value="' + args_digest({"path": "notes.txt", "content": "bye"}) in html
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()


def test_scripted_confirmed_edit_runs_the_edited_arguments(ann: Any, scribe_call: ToolCall, tmp_path: Path) -> None:
    new = {"path": "notes.txt", "content": "bye"}
    response = decide(client_for(ann), scribe_call, "approve_edited", edited_args=json.dumps(new),
                      edited_digest=args_digest(new))
    assert response.status_code == 302
    assert (tmp_path / "notes.txt").read_text() == "bye"
    decision = Decision.objects.get()
    assert decision.args == new and decision.digest == args_digest(new)


def test_confirmed_edit_must_match_what_was_reviewed(ann: Any, scribe_call: ToolCall, tmp_path: Path) -> None:
    reviewed = {"path": "notes.txt", "content": "bye"}
    response = decide(client_for(ann), scribe_call, "approve_edited", edited_args=edited(path="notes.txt", content="evil"),
                      edited_digest=args_digest(reviewed))
    assert response.status_code == 200 and "changed after you reviewed" in response.content.decode()
    assert not Decision.objects.exists() and not (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (edited(path="notes.txt"), "missing required argument content"),
        (edited(path="notes.txt", content="x", mode="rwx"), "unexpected argument mode"),
        (edited(path=5, content="x"), "argument path"),
        (edited(path="notes.txt", content="hi"), "unchanged"),
    ],
)
def test_invalid_edited_arguments_are_refused(ann: Any, scribe_call: ToolCall, text: str, message: str) -> None:
    response = decide(client_for(ann), scribe_call, "review_edit", edited_args=text)
    assert response.status_code == 200
    assert message in response.content.decode()
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", ".git/config", ".git/hooks/pre-commit"])
def test_edited_arguments_out_of_policy_are_refused(ann: Any, scribe_call: ToolCall, tmp_path: Path, path: str) -> None:
    new = {"path": path, "content": "owned"}
    client = client_for(ann)
    review = decide(client, scribe_call, "review_edit", edited_args=json.dumps(new))
    assert "refused" in review.content.decode()
    # Skipping the review and posting the confirmation directly is refused too.
    confirm = decide(client, scribe_call, "approve_edited", edited_args=json.dumps(new), edited_digest=args_digest(new))
    assert "refused" in confirm.content.decode()
    scribe_call.refresh_from_db()
    assert scribe_call.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert not (tmp_path.parent / "outside.txt").exists() and not (tmp_path / ".git").exists()


def test_back_to_editing_keeps_the_edited_text(ann: Any, scribe_call: ToolCall) -> None:
    response = decide(client_for(ann), scribe_call, "back", edited_args=edited(path="notes.txt", content="draft"))
    html = response.content.decode()
    assert response.status_code == 200 and "&quot;draft&quot;" in html
    assert not Decision.objects.exists()


def test_pages_refuse_framing(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    for url in (INBOX, decision_url(scribe_call), f"/admin/nexo_django/agentrun/{scribe_call.run_id}/change/"):
        assert client.get(url)["X-Frame-Options"] == "DENY"


def test_history_pages_refuse_framing_whatever_the_project_allows(
    ann: Any, scribe_call: ToolCall, settings: Any
) -> None:
    # A project that lets its own pages be framed by itself must not get framable admin pages.
    settings.X_FRAME_OPTIONS = "SAMEORIGIN"
    client = client_for(ann)
    pages = [
        f"/admin/nexo_django/pendingapproval/{scribe_call.pk}/history/",
        f"/admin/nexo_django/agentrun/{scribe_call.run_id}/history/",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200 and response["X-Frame-Options"] == "DENY", url
    decide(client, scribe_call, "approve")
    decision = Decision.objects.get(tool_call=scribe_call)
    response = client.get(f"/admin/nexo_django/decision/{decision.pk}/history/")
    assert response.status_code == 200 and response["X-Frame-Options"] == "DENY"


@pytest.mark.redis
def test_with_a_redis_queue_the_decision_only_enqueues_the_resume(
    ann: Any, scribe_call: ToolCall, tmp_path: Path, redis_queue_settings: Any
) -> None:
    from nexo_django.durable import dispatch

    client = client_for(ann)
    response = decide(client, scribe_call, "approve")
    run = scribe_call.run
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert not (tmp_path / "notes.txt").exists()  # no tool ran in the web request
    assert dispatch.job_exists(run.pk, run.generation)
    assert "is queued: a worker will continue it" in client.get(response["Location"]).content.decode()


def test_scripted_plain_approve_works_with_very_long_arguments(ann: Any, tmp_path: Path) -> None:
    from nexo_django.testing import ScriptedModel, reply, tool_call

    content = "line\n" * 60_000  # 300 kB: longer than an edit may be
    run = Scribe.run("long", cwd=tmp_path, model=ScriptedModel([tool_call("write", path="big.txt", content=content),
                                                                 reply("ok")]))
    call = run.pending_calls().get()
    # A browser posts the pre-filled editor too, with every button.
    decide(client_for(ann), call, "approve", edited_args=json_for_editor(call.args))
    assert (tmp_path / "big.txt").read_text() == content


def test_back_to_editing_opens_the_editor(ann: Any, scribe_call: ToolCall) -> None:
    client = client_for(ann)
    assert 'id="edit-form"' not in client.get(decision_url(scribe_call)).content.decode()
    response = decide(client, scribe_call, "back", edited_args=edited(path="notes.txt", content="draft"))
    assert 'id="edit-form"' in response.content.decode()
