"""The model's text as it is written reaches the run's page without PostgreSQL (issue 25,
point 3): from a worker in another process through the run queue's Redis (``PUBLISH``), and from
a run of an inline queue to the streams of its own process. The database here is SQLite, so
neither is NOTIFY. Scripted, streamed model (a word every 50 ms); a real ``rqworker``, a real
Redis and a real ASGI server (uvicorn) read the stream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

import pytest
from django.db import connection, transaction

from nexo_django.durable import live
from nexo_django.models import RunEvent, RunStatus
from tests.browsing import session_cookie
from tests.durable_agents import TOLD, Teller
from tests.event_stream import WAIT, Stream

pytestmark = [pytest.mark.django_db(transaction=True)]


def _pieces_before_done(stream: Stream) -> list[str]:
    done = [i for i, (_, kind) in enumerate(stream.events) if kind == "done"]
    assert done, stream.events
    return [text for seen, text in stream.deltas if seen <= done[0]]


def test_a_worker_in_another_process_sends_the_text_through_redis_scripted(
    rq_worker: Any, asgi_server: Any, django_user_model: Any
) -> None:
    assert live.delta_channel() == ("postgresql" if connection.vendor == "postgresql" else "redis")
    ann = django_user_model.objects.create_user("ann")
    run = Teller.run_later("Tell me a story.", user=ann)  # queued: no worker listens yet
    stream = Stream(f"{asgi_server.url}/runs/{run.pk}/stream/", session_cookie(ann))
    stream.start()
    stream.wait_open()  # the page's process listens (its Redis subscription is live)

    rq_worker(worker_class="rq.worker.SimpleWorker")  # another process runs it
    stream.join(WAIT)
    assert stream.ended and stream.error is None, (stream.events, stream.error)

    run.refresh_from_db()
    assert run.status == RunStatus.DONE and run.result == TOLD
    pieces = _pieces_before_done(stream)
    assert len(pieces) > 1, stream.deltas  # seen growing, not only finished
    assert "".join(text for _, text in stream.deltas) == TOLD  # each piece once, in order
    stored = list(RunEvent.objects.filter(run=run).order_by("id").values_list("id", "type"))
    assert stream.events == stored  # and the events as stored: the text is in none of them


def test_a_redis_that_does_not_answer_costs_the_run_one_timeout_scripted(settings: Any) -> None:
    """The queue's Redis accepts connections and never answers: the run is neither failed nor
    held up by its text; the worker tries once, then sends none for a while."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.listen(16)
        port = silent.getsockname()[1]
        settings.RQ_QUEUES = {**settings.RQ_QUEUES, "silent": {"URL": f"redis://127.0.0.1:{port}/0"}}
        settings.NEXO = {**settings.NEXO, "QUEUE": "silent"}
        assert live.delta_channel() == ("postgresql" if connection.vendor == "postgresql" else "redis")
        run = Teller.run("Tell me a story.")  # now, in this process: no queue needed
        assert run.status == RunStatus.DONE and run.result == TOLD
        silent.setblocking(False)
        tried = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                silent.accept()[0].close()
                tried += 1
    # One try on either database: the text so far is kept on the queue's Redis (on PostgreSQL the
    # pieces themselves go by NOTIFY), and after the timeout nothing is tried for a while.
    assert tried == 1


def test_an_inline_run_hands_its_text_to_the_streams_of_its_own_process_scripted() -> None:
    """An inline queue runs the run in this process (as the example's approver's request does
    under uvicorn): its text reaches this process's streams with no server between them."""
    if connection.vendor == "postgresql":
        assert live.delta_channel() == "postgresql"
        return
    assert live.delta_channel() == "process"
    loop = asyncio.new_event_loop()
    subscribed, got = threading.Event(), []

    async def read(run_id: Any) -> None:
        sub = await live.hub().subscribe(run_id)
        subscribed.set()
        try:
            while "".join(got) != TOLD:
                item = await sub.wait(2.0)  # the pieces come while the run runs
                if item is None:
                    return
                if isinstance(item, dict):
                    got.append(item["text"])
        finally:
            sub.close()

    with transaction.atomic():  # the inline job runs at commit, in this thread
        run = Teller.run_later("Tell me a story.")
        reader = threading.Thread(target=loop.run_until_complete, args=(read(run.pk),), daemon=True)
        reader.start()
        assert subscribed.wait(WAIT)
    run.refresh_from_db()
    reader.join(WAIT)
    assert not reader.is_alive()
    loop.close()
    assert run.status == RunStatus.DONE and run.result == TOLD
    assert len(got) > 1 and "".join(got) == TOLD
