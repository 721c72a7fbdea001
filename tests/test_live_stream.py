"""Live progress (issue 25, point 2): the run's events as Server-Sent Events from the async view,
served by a real ASGI server (uvicorn, another process) while this process writes them; the
stream is cut twice in the middle and resumed from ``Last-Event-ID``: no event lost or repeated.
Scripted agent, inline queue: this process drives the run, as a worker would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client

from nexo_django import Agent
from nexo_django.models import RunEvent, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.browsing import session_cookie
from tests.event_stream import WAIT, Stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


class TwoWrites(Agent):
    """Scripted: two gated writes, one turn each, then an answer."""

    model = ScriptedModel([
        tool_call("write", path="a.txt", content="A"),
        tool_call("write", path="b.txt", content="B"),
        reply("Both written."),
    ])
    sandbox = "local"
    permissions = "approve"


#: This test's own LISTEN connections: the suite's other process has its own, on the same server.
OWN_LISTENERS = "query LIKE 'LISTEN nexo_%%' AND datname = current_database()"


def _listening() -> bool:
    """Whether a server process LISTENs for the events' notifications (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {OWN_LISTENERS}")
        return bool(cursor.fetchone()[0])


def test_the_stream_resumes_after_two_drops_with_no_event_lost_or_repeated_scripted(
    asgi_server: Any, tmp_path: Path, django_user_model: Any
) -> None:
    ann = django_user_model.objects.create_user("ann")
    run = TwoWrites.run("write both", cwd=tmp_path, user=ann)
    assert run.status == RunStatus.SUSPENDED
    url, session = f"{asgi_server.url}/runs/{run.pk}/stream/", session_cookie(ann)
    page = httpx.get(f"{asgi_server.url}/runs/{run.pk}/", cookies={"sessionid": session}, timeout=WAIT).text
    assert 'id="run-stream"' in page and 'id="run-poll"' not in page  # under ASGI the page follows the stream

    first = Stream(url, session, drop_after=3)  # dropped in the middle of what is stored
    first.start()
    first.join(WAIT)
    assert first.events and len(first.events) == 3, (first.events, first.error)

    second = Stream(url, session, last_id=first.last(), drop_after=7)
    second.start()
    second.saw("suspended")  # caught up: the rest of the first drive's events
    assert _listening() == (connection.vendor == "postgresql")  # NOTIFY wakes it there, polling elsewhere
    run.pending_calls().get().approve()  # this process writes; the server's stream wakes up
    second.join(WAIT)
    assert not second.is_alive() and second.error is None

    third = Stream(url, session, last_id=second.last())
    third.start()
    third.saw("suspended")  # the second write waits
    run.pending_calls().get().approve()
    third.join(WAIT)
    assert third.ended and third.error is None, (third.events, third.error)

    got = [e for stream in (first, second, third) for e in stream.events]
    stored = list(RunEvent.objects.filter(run=run).order_by("id").values_list("id", "type"))
    assert got == stored  # every event, in order, once
    assert stored[-1][1] == "done" and sum(t == "suspended" for _, t in stored) == 2
    assert (tmp_path / "b.txt").read_text() == "B"


@pytest.mark.postgresql_only
def test_a_dropped_listen_connection_comes_back_and_no_event_is_lost_scripted(
    asgi_server: Any, tmp_path: Path, django_user_model: Any
) -> None:
    """The server's LISTEN connection is terminated; a decision commits before it is back (its
    NOTIFY reaches nobody): the stream still gets every event, once, in order."""
    ann = django_user_model.objects.create_user("ann")
    run = TwoWrites.run("write both", cwd=tmp_path, user=ann)
    stream = Stream(f"{asgi_server.url}/runs/{run.pk}/stream/", session_cookie(ann))
    stream.start()
    stream.saw("suspended")
    assert _listening()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       f"WHERE {OWN_LISTENERS} AND pid <> pg_backend_pid()")
        assert cursor.rowcount >= 1
    run.pending_calls().get().approve()  # at once: the listener is not back yet
    stream.saw("suspended", 2)  # woken when the listener came back and every stream read again
    assert _listening()
    run.pending_calls().get().approve()
    stream.join(WAIT)
    assert stream.ended and stream.error is None, (stream.events, stream.error)
    assert stream.events == list(RunEvent.objects.filter(run=run).order_by("id").values_list("id", "type"))


def test_the_stream_is_only_for_who_may_see_the_run(asgi_server: Any, tmp_path: Path, django_user_model: Any) -> None:
    ann = django_user_model.objects.create_user("ann")
    bob = django_user_model.objects.create_user("bob")
    run = TwoWrites.run("write both", cwd=tmp_path, user=ann)
    response = httpx.get(f"{asgi_server.url}/runs/{run.pk}/stream/", cookies={"sessionid": session_cookie(bob)}, timeout=WAIT)
    assert response.status_code == 404
    response = httpx.get(f"{asgi_server.url}/runs/{run.pk}/stream/", headers={"Last-Event-ID": "x"},
                         cookies={"sessionid": session_cookie(ann)}, timeout=WAIT)
    assert response.status_code == 400 and "Last-Event-ID" in response.json()["error"]


def test_under_wsgi_the_stream_says_to_poll(tmp_path: Path, django_user_model: Any, settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"
    ann = django_user_model.objects.create_user("ann")
    run = TwoWrites.run("write both", cwd=tmp_path, user=ann)
    client = Client()
    client.force_login(ann)
    response = client.get(f"/runs/{run.pk}/stream/")
    assert response.status_code == 501 and "poll" in response.json()["error"]
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "run-poll" in page and "run-stream" not in page


def test_a_run_finishing_between_the_streams_reads_loses_no_event(tmp_path: Path, django_user_model: Any) -> None:
    """The stream reads the run's status and its events in two statements; a worker's last
    commit (its events and the terminal status together) lands between them here. Whatever the
    stream then concludes, it never ends the stream without those events."""
    from nexo_django.durable import live

    run = TwoWrites.run("write both", cwd=tmp_path)
    last = RunEvent.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first() or 0
    done = {"done": False}

    def finish_between(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not done["done"]:
            done["done"] = True  # the worker's last commit, right after the stream's first read
            from nexo_django.models import AgentRun

            RunEvent.objects.create(run=run, type="done", data={})
            AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.DONE)
        return result

    with connection.execute_wrapper(finish_between):
        rows, status, terminal = live._read(run.pk, last)
    assert done["done"]
    assert not terminal or [r["type"] for r in rows] == ["done"]
