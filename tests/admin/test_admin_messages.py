"""The admin's messages say what happened (issue 24, item 6): a job Redis did not take, a run
stopped by its approver, a race an approver lost. Scripted agents; Redis down is a closed
loopback port."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from django.contrib.messages import get_messages

from nexo_django.models import AgentRun, RunStatus
from tests.admin.support import client_for, csrf_post, decision_url, make_user, page_digest
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_down(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"URL": f"redis://127.0.0.1:{_closed_port()}/0"}}


def _decide(user: Any, call: Any, action: str) -> list[str]:
    client = client_for(user)
    page = client.get(decision_url(call)).content.decode()
    response = csrf_post(client, decision_url(call), {"action": action, "digest": page_digest(page)})
    assert response.status_code == 302
    return [str(m) for m in get_messages(response.wsgi_request)]


def _pending(tmp_path: Path, settings: Any) -> Any:
    queues = settings.RQ_QUEUES
    settings.RQ_QUEUES = {"default": {"ASYNC": False}}
    run = Scribe.run("write hi", cwd=tmp_path)  # suspended on its write, in process
    settings.RQ_QUEUES = queues
    [call] = run.pending_calls()
    return call


def test_approve_with_redis_down_says_the_job_waits_for_the_reconciler_scripted(
    redis_down: None, settings: Any, tmp_path: Path
) -> None:
    call = _pending(tmp_path, settings)
    [message] = _decide(make_user("ann", "nexo_django.decide_toolcall"), call, "approve")
    assert "a worker will continue it" not in message
    assert "could not be sent to a worker" in message and "nexo_reconcile" in message
    assert AgentRun.objects.get(pk=call.run_id).status == RunStatus.QUEUED


def test_deny_and_stop_says_the_run_stops_scripted(redis_down: None, settings: Any, tmp_path: Path) -> None:
    call = _pending(tmp_path, settings)
    [message] = _decide(make_user("ann", "nexo_django.decide_toolcall"), call, "deny_stop")
    assert "Denied (run stopped)" in message
    assert "a worker will continue it" not in message and "stops: nothing more of it runs" in message


def test_deny_and_stop_on_an_inline_queue_says_cancelled_scripted(tmp_path: Path) -> None:
    call = Scribe.run("write hi", cwd=tmp_path).pending_calls().get()
    [message] = _decide(make_user("ann", "nexo_django.decide_toolcall"), call, "deny_stop")
    assert "was cancelled" in message


def test_the_approver_who_lost_a_race_learns_who_decided_and_how_scripted(tmp_path: Path) -> None:
    call = Scribe.run("write hi", cwd=tmp_path).pending_calls().get()
    ann, bob = make_user("ann", "nexo_django.decide_toolcall"), make_user("bob", "nexo_django.decide_toolcall")
    bob_client = client_for(bob)
    bob_page = bob_client.get(decision_url(call)).content.decode()  # bob looks first ...
    _decide(ann, call, "deny")  # ... ann decides first
    response = csrf_post(bob_client, decision_url(call), {"action": "approve", "digest": page_digest(bob_page)})
    [message] = [str(m) for m in get_messages(response.wsgi_request)]
    assert message.startswith("Nothing changed")
    assert "ann denied it" in message
