"""The runs admin: changelist, read-only detail, cancel, retry, and settling an unknown outcome
(scripted agents; a crashed worker's state is left as the reconciler finds it)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexo_django.durable.recovery import reconcile
from nexo_django.models import AgentRun, CallStatus, Decision, RunStatus, ToolCall
from tests.admin.support import (
    RUNS,
    approver,
    client_for,
    csrf_post,
    make_user,
    pending_rows,
    run_url,
    viewer,
)
from tests.durable_agents import Bumper, Scribe, count

# Decisions and searches behave the same on PostgreSQL: `make test` runs these there too.
pytestmark = [pytest.mark.durable]


def crashed_while_executing(ann: Any) -> ToolCall:
    """A Bumper run whose approved, non-idempotent call was executing when its worker died,
    brought to needs_attention by the reconciler."""
    run = Bumper.run("bump once")
    [call] = run.pending_calls()
    Decision.objects.create(tool_call=call, verdict="approved", digest=call.digest, decided_by=ann, source="api")
    ToolCall.objects.filter(pk=call.pk).update(status=CallStatus.EXECUTING)
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, lease_owner="dead-worker", lease_expires_at=timezone.now() - timedelta(minutes=1)
    )
    report = reconcile()
    assert report.needs_attention == [str(run.pk)]
    call.refresh_from_db()
    assert call.status == CallStatus.OUTCOME_UNKNOWN
    return call


# --- changelist ------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_runs_changelist_filters_by_status_agent_creator_and_age() -> None:
    starter = make_user("starter")
    calls = pending_rows(4, agents=4, user=starter)
    runs = [c.run for c in calls]
    AgentRun.objects.filter(pk=runs[0].pk).update(status=RunStatus.DONE, created_by=None)
    AgentRun.objects.filter(pk=runs[1].pk).update(created_at=timezone.now() - timedelta(days=2))
    client = client_for(approver())

    def listed(query: str) -> set[str]:
        html = client.get(RUNS + "?" + query).content.decode()
        return {str(r.pk) for r in runs if f"/agentrun/{r.pk}/change/" in html}

    assert listed("") == {str(r.pk) for r in runs}
    assert listed("status__exact=done") == {str(runs[0].pk)}
    assert listed("agent=tests.durable_agents.Agent2") == {str(runs[2].pk)}
    assert listed(f"created_by__id__exact={starter.pk}") == {str(r.pk) for r in runs[1:]}
    assert listed("age=1d") == {str(runs[1].pk)}
    # A run's pending calls link to the inbox, searched by the run's id.
    assert f'href="/admin/nexo_django/pendingapproval/?q={runs[2].pk}">1</a>' in client.get(RUNS).content.decode()


@pytest.mark.django_db
def test_runs_changelist_query_count_does_not_grow_with_rows() -> None:
    client = client_for(approver())
    pending_rows(10, agents=10)

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(RUNS).status_code == 200
        return len(ctx.captured_queries)

    few = count()
    pending_rows(300, agents=300)
    assert count() == few


# --- detail ----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_detail_shows_transcript_events_calls_and_decisions(tmp_path: Path) -> None:
    ann = approver()
    run = Scribe.run("write hi please", cwd=tmp_path)
    [call] = run.pending_calls()
    call.approve(by=ann, note="looks fine")
    html = client_for(ann).get(run_url(run)).content.decode()
    assert 'id="run-status">done<' in html
    assert "write hi please" in html and "Done." in html  # transcript and result
    assert "looks fine" in html and "approved</strong> by ann" in html  # the decision
    assert "decision" in html and "created" in html  # events
    assert "Cancel this run" not in html  # finished runs cannot be cancelled


@pytest.mark.django_db
def test_run_detail_transcript_is_cut_and_expandable() -> None:
    [call] = pending_rows(1, agents=1)
    from nexo_django.models import RunMessage

    RunMessage.objects.bulk_create(
        RunMessage(run_id=call.run_id, seq=i, role="user", data={"role": "user", "content": f"message number {i}"})
        for i in range(1, 60)
    )
    client = client_for(approver())
    short = client.get(run_url(call.run)).content.decode()
    assert "message number 59" in short and "message number 5<" not in short
    assert "Messages 41–60 of 60" in short
    first = client.get(run_url(call.run) + "?transcript=all").content.decode()
    assert "message number 5<" in first and "message number 59" not in first
    assert "Messages 1–20 of 60" in first
    later = client.get(run_url(call.run) + "?transcript_from=20").content.decode()
    assert "message number 20<" in later and "message number 39<" in later and "message number 40<" not in later


@pytest.mark.django_db(transaction=True)
def test_cancel_button_cancels_a_suspended_run(tmp_path: Path) -> None:
    run = Scribe.run("write", cwd=tmp_path)
    client = client_for(approver())
    assert "Cancel this run" in client.get(run_url(run)).content.decode()
    response = csrf_post(client, run_url(run), {"action": "cancel"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert ToolCall.objects.get(run=run).status == CallStatus.EXPIRED
    assert "was cancelled" in client.get(response["Location"]).content.decode()


@pytest.mark.django_db(transaction=True)
def test_staff_without_permission_cannot_cancel(tmp_path: Path) -> None:
    run = Scribe.run("write", cwd=tmp_path)
    client = client_for(viewer())
    page = client.get(run_url(run)).content.decode()
    assert "Cancel this run" not in page
    assert csrf_post(client, run_url(run), {"action": "cancel"}).status_code == 403
    assert csrf_post(client, RUNS, {"action": "cancel_selected", "index": "0", ACTION_CHECKBOX_NAME: [run.pk]}).status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED


@pytest.mark.django_db(transaction=True)
def test_cancel_selected_runs_action(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runs = [Scribe.run("write", cwd=tmp_path / "a"), Scribe.run("write", cwd=tmp_path / "b")]
    response = csrf_post(client_for(approver()), RUNS, {"action": "cancel_selected", "index": "0",
                                                       ACTION_CHECKBOX_NAME: [r.pk for r in runs]})
    assert response.status_code == 302
    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}


@pytest.mark.django_db(transaction=True)
def test_scripted_do_not_run_it_again_tells_the_model_and_finishes(counter: Path) -> None:
    ann = approver()
    call = crashed_while_executing(ann)
    client = client_for(ann)
    page = client.get(run_url(call.run)).content.decode()
    assert "Run it again" in page and "Do not run it again" in page and "Retry this run" not in page
    response = csrf_post(client, run_url(call.run), {"action": "do_not_rerun", "call": call.pk, "note": "did it by hand"})
    assert response.status_code == 302
    run = AgentRun.objects.get(pk=call.run_id)
    assert run.status == RunStatus.DONE
    assert count(counter) == []
    assert "did it by hand" in run.transcript()[-2]["content"]["error"]


@pytest.mark.django_db(transaction=True)
def test_scripted_run_it_again_executes_the_call_once_more(counter: Path) -> None:
    ann = approver()
    call = crashed_while_executing(ann)
    response = csrf_post(client_for(ann), run_url(call.run), {"action": "rerun", "call": call.pk})
    assert response.status_code == 302
    run = AgentRun.objects.get(pk=call.run_id)
    assert run.status == RunStatus.DONE
    assert count(counter) == ["one"]


@pytest.mark.django_db(transaction=True)
def test_scripted_retry_button_after_the_outcome_was_settled_elsewhere(counter: Path) -> None:
    ann = approver()
    call = crashed_while_executing(ann)
    call.resolve_unknown(by=ann, rerun=False)
    client = client_for(ann)
    assert "Retry this run" in client.get(run_url(call.run)).content.decode()
    csrf_post(client, run_url(call.run), {"action": "retry"})
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.DONE
    assert count(counter) == []


@pytest.mark.django_db(transaction=True)
def test_settling_an_unknown_outcome_needs_the_permission(counter: Path) -> None:
    call = crashed_while_executing(approver())
    client = client_for(viewer())
    assert "Run it again" not in client.get(run_url(call.run)).content.decode()
    assert csrf_post(client, run_url(call.run), {"action": "rerun", "call": call.pk}).status_code == 403
    call.refresh_from_db()
    assert call.status == CallStatus.OUTCOME_UNKNOWN and count(counter) == []


@pytest.mark.django_db(transaction=True)
def test_settling_twice_changes_nothing_the_second_time(counter: Path) -> None:
    ann = approver()
    call = crashed_while_executing(ann)
    client = client_for(ann)
    csrf_post(client, run_url(call.run), {"action": "rerun", "call": call.pk})
    second = csrf_post(client, run_url(call.run), {"action": "rerun", "call": call.pk})
    assert "Nothing changed" in client.get(second["Location"]).content.decode()
    assert count(counter) == ["one"]
