"""Live progress (issue 25, point 2): the run's events as Server-Sent Events from the async view,
served by a real ASGI server (uvicorn, another process) while this process writes them; the
stream is cut twice in the middle and resumed from ``Last-Event-ID``: no event lost or repeated.
Scripted agent, inline queue: this process drives the run, as a worker would."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client

from nexo_django import Agent
from nexo_django.models import RunEvent, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

WAIT = 20.0


class TwoWrites(Agent):
    """Scripted: two gated writes, one turn each, then an answer."""

    model = ScriptedModel([
        tool_call("write", path="a.txt", content="A"),
        tool_call("write", path="b.txt", content="B"),
        reply("Both written."),
    ])
    sandbox = "local"
    permissions = "approve"


class Stream(threading.Thread):
    """Reads ``url`` as an event stream in a thread: the events (id, type) it got, until
    ``event: end`` or until ``drop_after`` events (then it closes the connection, as a dropped
    network would). ``saw(type)`` waits until an event of that type came."""

    def __init__(self, url: str, session: str, *, last_id: int | None = None, drop_after: int | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.session, self.last_id, self.drop_after = url, session, last_id, drop_after
        self.events: list[tuple[int, str]] = []
        #: the model's text as it came (event: delta), with how many events came before each piece
        self.deltas: list[tuple[int, str]] = []
        self.status: int | None = None
        self.ended = False
        #: the stream's first line (the retry hint) came: it is subscribed to the run
        self.opened = False
        self.error: BaseException | None = None
        self._changed = threading.Condition()

    def run(self) -> None:
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        try:
            with httpx.Client(cookies={"sessionid": self.session}, timeout=httpx.Timeout(WAIT)) as client, \
                    client.stream("GET", self.url, headers=headers) as response:
                self.status = response.status_code
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    if self._dispatch(fields):
                        return
                    fields = {}
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            with self._changed:
                self._changed.notify_all()

    def _dispatch(self, fields: dict[str, str]) -> bool:
        """Record one event; True to stop reading."""
        if fields.get("event") == "end":
            self.ended = True
            return True
        if "retry" in fields:
            with self._changed:
                self.opened = True
                self._changed.notify_all()
            return False
        if fields.get("event") == "delta":  # the model's text: no id, not stored
            with self._changed:
                self.deltas.append((len(self.events), json.loads(fields["data"])["text"]))
                self._changed.notify_all()
            return False
        if "id" not in fields:
            return False  # a comment or the retry hint
        data = json.loads(fields["data"])
        assert data["id"] == int(fields["id"]) and data["type"] == fields["event"]
        with self._changed:
            self.events.append((int(fields["id"]), fields["event"]))
            self._changed.notify_all()
        return self.drop_after is not None and len(self.events) >= self.drop_after

    def saw(self, type: str, count: int = 1) -> None:
        with self._changed:
            ok = self._changed.wait_for(
                lambda: sum(t == type for _, t in self.events) >= count or not self.is_alive(), WAIT
            )
        assert ok and sum(t == type for _, t in self.events) >= count, (self.events, self.error)

    def wait_open(self) -> None:
        with self._changed:
            ok = self._changed.wait_for(lambda: self.opened or not self.is_alive(), WAIT)
        assert ok and self.opened, (self.status, self.error)

    def last(self) -> int:
        return self.events[-1][0]


def _listening() -> bool:
    """Whether a server process LISTENs for the events' notifications (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        # this test's database only: the suite's other process has its own on the same server
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN nexo_%%' "
                       "AND datname = current_database()")
        return bool(cursor.fetchone()[0])


def _session(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_the_stream_resumes_after_two_drops_with_no_event_lost_or_repeated_scripted(
    asgi_server: Any, tmp_path: Path, django_user_model: Any
) -> None:
    ann = django_user_model.objects.create_user("ann")
    run = TwoWrites.run("write both", cwd=tmp_path, user=ann)
    assert run.status == RunStatus.SUSPENDED
    url, session = f"{asgi_server.url}/runs/{run.pk}/stream/", _session(ann)
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
    stream = Stream(f"{asgi_server.url}/runs/{run.pk}/stream/", _session(ann))
    stream.start()
    stream.saw("suspended")
    assert _listening()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE query LIKE 'LISTEN nexo_%%' AND pid <> pg_backend_pid() "
                       "AND datname = current_database()")
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
    response = httpx.get(f"{asgi_server.url}/runs/{run.pk}/stream/", cookies={"sessionid": _session(bob)}, timeout=WAIT)
    assert response.status_code == 404
    response = httpx.get(f"{asgi_server.url}/runs/{run.pk}/stream/", headers={"Last-Event-ID": "x"},
                         cookies={"sessionid": _session(ann)}, timeout=WAIT)
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
