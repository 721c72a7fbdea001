"""A durable run whose provider streams (issue 25, point 3): the transcript stores the finished
message only, exactly as for a reply that was not streamed; the text travels to the readers as
it is written (here PostgreSQL's ``NOTIFY nexo_deltas``; Redis and the process's own streams in
tests/test_live_text.py) and is never stored; a stream cut off midway
is a failed model turn like any other: retried, never half-stored. Real HTTP to a loopback
server speaking the OpenAI wire format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from nexo_django import Agent
from nexo_django.core.llm.openai import OpenAIModel
from nexo_django.durable import live
from nexo_django.models import RunEvent, RunMessage, RunStatus
from tests.wire_server import Answer, WireServer, openai_stream

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

ANSWER = ["Paris is ", "the capital ", "of France."]


class Geographer(Agent):
    """Its model is given per run (a loopback provider)."""

    sandbox = "virtual"


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


def _model(server: WireServer, *, stream: bool = True) -> OpenAIModel:
    return OpenAIModel("gpt-4.1-mini", base_url=f"{server.url}/v1", sleep=lambda _: None, stream=stream, max_retries=2)


def _assistant_rows(run: Any) -> list[dict[str, Any]]:
    return [m.data for m in RunMessage.objects.filter(run=run, role="assistant").order_by("seq")]


def test_a_streamed_reply_is_stored_as_the_reply_that_was_not_streamed(server: WireServer) -> None:
    server.play(
        Answer(events=openai_stream(ANSWER)),
        Answer(body={"choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "".join(ANSWER)}}],
                     "usage": {"prompt_tokens": 11, "completion_tokens": 7}}),
    )
    streamed = Geographer.run("Capital of France?", model=_model(server))
    plain = Geographer.run("Capital of France?", model=_model(server, stream=False))
    assert streamed.status == plain.status == RunStatus.DONE
    assert _assistant_rows(streamed) == _assistant_rows(plain) == [
        {"role": "assistant", "content": "Paris is the capital of France.", "usage": {"input_tokens": 11, "output_tokens": 7}}
    ]
    assert streamed.result == plain.result
    # no row per delta: the same rows and events as the run that was not streamed
    assert RunMessage.objects.filter(run=streamed).count() == RunMessage.objects.filter(run=plain).count()
    assert list(RunEvent.objects.filter(run=streamed).values_list("type", flat=True)) == \
        list(RunEvent.objects.filter(run=plain).values_list("type", flat=True))


def test_a_stream_cut_off_midway_is_retried_and_never_half_stored(server: WireServer) -> None:
    whole = openai_stream(ANSWER)
    server.play(Answer(events=whole[:3], cut=True), Answer(events=whole))
    run = Geographer.run("Capital of France?", model=_model(server))
    assert run.status == RunStatus.DONE and len(server.requests) == 2
    assert [m["content"] for m in _assistant_rows(run)] == ["Paris is the capital of France."]


def test_a_stream_cut_off_every_time_fails_the_run_with_nothing_of_it_stored(server: WireServer) -> None:
    whole = openai_stream(ANSWER)
    server.play(*[Answer(events=whole[:3], cut=True) for _ in range(3)])
    run = Geographer.run("Capital of France?", model=_model(server))
    assert run.status == RunStatus.FAILED and "could not reach" in run.error
    assert _assistant_rows(run) == []
    assert list(RunMessage.objects.filter(run=run).values_list("role", flat=True)) == ["user"]


@pytest.mark.postgresql_only
def test_the_text_travels_to_the_readers_as_it_is_written(server: WireServer) -> None:
    """On PostgreSQL the worker NOTIFYs the pieces (one listener here reads them). The other
    channels (Redis, the process's own streams) are tests/test_live_text.py's."""
    server.play(Answer(events=openai_stream(ANSWER)))
    assert live.delta_channel() == "postgresql"
    listener = _listen()
    try:
        run = Geographer.run("Capital of France?", model=_model(server))
        assert run.status == RunStatus.DONE
        deltas = [json.loads(n.payload) for n in listener.notifies(timeout=2.0)]
    finally:
        listener.close()
    assert deltas and {d["run"] for d in deltas} == {str(run.pk)}
    assert "".join(d["text"] for d in deltas) == "".join(ANSWER)
    assert {(d["turn"], d["attempt"]) for d in deltas} == {(1, 0)}


def _listen() -> Any:
    import psycopg

    params = dict(connection.get_connection_params())
    for key in ("context", "cursor_factory", "prepare_threshold"):
        params.pop(key, None)
    listener = psycopg.connect(autocommit=True, **params)
    listener.execute(f"LISTEN {live.DELTAS_CHANNEL}")
    return listener
