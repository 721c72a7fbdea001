"""Streamed replies (issue 25, point 3): both providers ask for ``stream: true`` and read the
Server-Sent Events each one really sends, over real HTTP from a loopback server (chunked, one
event a chunk). The reply is the message the non-streamed answer gives; its text is handed on as
it arrives; a stream cut off midway is a failed request: retried, never half-returned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nexo_django.core.llm.anthropic import AnthropicModel
from nexo_django.core.llm.anthropic import from_wire as anthropic_from_wire
from nexo_django.core.llm.http import ProviderError
from nexo_django.core.llm.openai import OpenAIModel
from nexo_django.core.llm.openai import from_wire as openai_from_wire
from tests.wire_server import Answer, WireServer, anthropic_stream, openai_stream

USER = [{"role": "user", "content": "hello"}]
WRITE = {"name": "write", "description": "write a file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


def _openai(server: WireServer, **kwargs: Any) -> OpenAIModel:
    return OpenAIModel("gpt-4.1-mini", base_url=f"{server.url}/v1", sleep=lambda _: None, **kwargs)


def _anthropic(server: WireServer, **kwargs: Any) -> AnthropicModel:
    return AnthropicModel("claude-sonnet-4-5", base_url=server.url, sleep=lambda _: None, **kwargs)


class Texts:
    """What ``on_text`` was given: (attempt, piece)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, str]] = []

    def __call__(self, attempt: int, piece: str) -> None:
        self.got.append((attempt, piece))


def test_openai_streams_text_as_it_arrives_and_returns_the_whole_reply(server: WireServer) -> None:
    server.play(Answer(events=openai_stream(["Hel", "lo, ", "world."])))
    texts = Texts()
    completion = _openai(server).complete(USER, [], on_text=texts)
    assert texts.got == [(0, "Hel"), (0, "lo, "), (0, "world.")]
    assert completion.message == {"role": "assistant", "content": "Hello, world."}
    assert completion.usage == {"input_tokens": 11, "output_tokens": 7}
    body = server.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_openai_streamed_tool_calls_are_the_non_streamed_message(server: WireServer) -> None:
    calls = [{"id": "call_a", "name": "write", "args": {"path": "notes.txt", "content": "hi there"}},
             {"id": "call_b", "name": "write", "args": {"path": "b.txt", "content": "{\"quoted\": true}"}}]
    server.play(Answer(events=openai_stream(["Writing both."], tool_calls=calls, finish="tool_calls")))
    completion = _openai(server).complete(USER, [WRITE])
    same = openai_from_wire({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Writing both.",
        "tool_calls": [{"id": c["id"], "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["args"])}} for c in calls],
    }}], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}, "127.0.0.1")
    assert completion.message == same.message and completion.usage == same.usage
    assert [c["args"] for c in completion.message["tool_calls"]] == [c["args"] for c in calls]


def test_openai_stream_cut_off_midway_is_retried_and_never_half_returned(server: WireServer) -> None:
    whole = openai_stream(["The answer ", "is 42."])
    server.play(Answer(events=whole[:2], cut=True), Answer(events=whole))
    texts = Texts()
    completion = _openai(server).complete(USER, [], on_text=texts)
    assert completion.message["content"] == "The answer is 42."
    assert len(server.requests) == 2
    # the first attempt's text came, then the retried one's from its start: readers start over
    assert texts.got == [(0, "The answer "), (1, "The answer "), (1, "is 42.")]


def test_openai_stream_ending_before_its_finish_is_a_failed_request(server: WireServer) -> None:
    whole = openai_stream(["half"])
    unfinished = [e for e in whole if "finish_reason\": \"stop" not in e and "[DONE]" not in e]
    server.play(*[Answer(events=unfinished) for _ in range(3)])
    with pytest.raises(ProviderError, match="cut off midway.*gave up after 3 attempts"):
        _openai(server, max_retries=2).complete(USER, [])
    assert len(server.requests) == 3


def test_openai_stream_cut_every_time_fails_after_the_retries(server: WireServer) -> None:
    whole = openai_stream(["never ", "finished"])
    server.play(*[Answer(events=whole[:3], cut=True) for _ in range(3)])
    with pytest.raises(ProviderError, match="could not reach .* after 3 attempt"):
        _openai(server, max_retries=2).complete(USER, [])


def test_openai_error_inside_the_stream_is_retried(server: WireServer) -> None:
    error = 'data: {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}\n\n'
    server.play(Answer(events=[openai_stream(["x"])[0], error]), Answer(events=openai_stream(["fine"])))
    assert _openai(server).complete(USER, []).message["content"] == "fine"


def test_openai_stream_off_sends_no_stream(server: WireServer) -> None:
    server.play(Answer(body={"choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "plain"}}]}))
    assert _openai(server, stream=False).complete(USER, []).message["content"] == "plain"
    assert "stream" not in server.requests[0].body


ANTHROPIC_BLOCKS: list[dict[str, Any]] = [
    {"type": "thinking", "thinking": "The user wants a note.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"},
    {"type": "text", "text": "I'll write the note now."},
    {"type": "tool_use", "id": "toolu_01A", "name": "write", "input": {"path": "notes.txt", "content": "hi \"there\""}},
]


def test_anthropic_streams_text_and_returns_the_non_streamed_message(server: WireServer) -> None:
    server.play(Answer(events=anthropic_stream(ANTHROPIC_BLOCKS, stop_reason="tool_use")))
    texts = Texts()
    completion = _anthropic(server).complete(USER, [WRITE], on_text=texts)
    assert "".join(piece for _, piece in texts.got) == "I'll write the note now."
    assert {attempt for attempt, _ in texts.got} == {0} and len(texts.got) > 1
    same = anthropic_from_wire({"id": "msg_wire", "type": "message", "role": "assistant", "content": ANTHROPIC_BLOCKS,
                                "stop_reason": "tool_use", "usage": {"input_tokens": 25, "output_tokens": 15}}, "127.0.0.1")
    assert completion.message == same.message  # the thinking block and its signature kept, in place
    assert completion.usage == {"input_tokens": 25, "output_tokens": 15}
    assert server.requests[0].body["stream"] is True


def test_anthropic_stream_cut_off_midway_is_retried(server: WireServer) -> None:
    whole = anthropic_stream([{"type": "text", "text": "A complete answer."}])
    server.play(Answer(events=whole[:5], cut=True), Answer(events=whole))
    completion = _anthropic(server).complete(USER, [])
    assert completion.message["content"] == "A complete answer." and len(server.requests) == 2


def test_anthropic_stream_without_message_stop_is_a_failed_request(server: WireServer) -> None:
    whole = anthropic_stream([{"type": "text", "text": "half of it"}])
    server.play(*[Answer(events=whole[:-1]) for _ in range(2)])
    with pytest.raises(ProviderError, match="message_stop never came"):
        _anthropic(server, max_retries=1).complete(USER, [])


def test_anthropic_overloaded_error_event_is_retried(server: WireServer) -> None:
    overloaded = 'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
    whole = anthropic_stream([{"type": "text", "text": "after the overload"}])
    server.play(Answer(events=[*whole[:3], overloaded]), Answer(events=whole))
    assert _anthropic(server).complete(USER, []).message["content"] == "after the overload"


def test_anthropic_http_error_before_the_stream_is_handled_as_before(server: WireServer) -> None:
    server.play(Answer(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}))
    with pytest.raises(ProviderError, match="HTTP 400 .*bad"):
        _anthropic(server).complete(USER, [])
