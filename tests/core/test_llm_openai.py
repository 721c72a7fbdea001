"""The OpenAI Chat Completions provider, over real HTTP against a loopback server.

Fixtures follow the public API reference (platform.openai.com/docs/api-reference/chat):
``choices[0].message.tool_calls[].function.arguments`` is a JSON *string*, a tool-calling turn
ends with ``finish_reason: "tool_calls"``, usage is ``prompt_tokens``/``completion_tokens``,
errors are ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from nexo_django import Agent, ConfigurationError
from nexo_django.core.errors import ModelError
from nexo_django.core.llm import resolve_model
from nexo_django.core.llm.http import ProviderError
from nexo_django.core.llm.openai import OpenAIModel
from tests.wire_server import CLIENTS, Answer, GeminiRules, WireServer, free_port, provider_client

WRITE_SPEC = {
    "name": "write",
    "description": "Write a file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    },
}
READ_SPEC = {
    "name": "read",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def completion(message: dict[str, Any], finish_reason: str, prompt: int = 82, completion_: int = 17) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1741569952,
        "model": "gpt-4.1-mini-2025-04-14",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "refusal": None, "annotations": [], **message},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion_,
            "total_tokens": prompt + completion_,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_b376dfbbd5",
    }


def text(content: str, **usage: int) -> dict[str, Any]:
    return completion({"content": content}, "stop", **usage)


def calls(*pairs: tuple[str, str, str]) -> dict[str, Any]:
    """A tool-calling turn; each pair is (id, name, arguments as the raw JSON string)."""
    tool_calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in pairs]
    return completion({"content": None, "tool_calls": tool_calls}, "tool_calls")


def api_error(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client | None]:
    yield from provider_client(request.param)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def model(server: WireServer, client: httpx.Client | None, sleeps: list[float]) -> OpenAIModel:
    return OpenAIModel(
        "gpt-4.1-mini", api_key="sk-test-123", base_url=server.url + "/v1", client=client, timeout=5, sleep=sleeps.append
    )


USER = [{"role": "user", "content": "Write hi to notes.txt"}]


# --- requests ----------------------------------------------------------------------------


def test_request_goes_to_chat_completions_with_bearer_key(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete(USER, [])
    [request] = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test-123"
    assert request.headers["content-type"] == "application/json"
    assert request.body["model"] == "gpt-4.1-mini"


def test_the_request_carries_the_clients_headers_and_compact_json(
    server: WireServer, model: OpenAIModel, client: httpx.Client | None,
) -> None:
    # The shared client's requests skip httpx's Client layers: what it would add must still go.
    server.play(Answer(body=text("ok")))
    model.complete([{"role": "user", "content": "héllo"}], [])
    [request] = server.requests
    expected = httpx.Client(headers=None if client is not None else {"user-agent": "nexo-django/0.1"}).headers
    assert request.headers["user-agent"] == expected["user-agent"]
    assert request.headers["accept-encoding"] == expected["accept-encoding"]
    assert request.headers["host"] == server.url.removeprefix("http://")
    assert request.body["messages"] == [{"role": "user", "content": "héllo"}]
    compact = json.dumps(request.body, ensure_ascii=False, separators=(",", ":")).encode()
    assert int(request.headers["content-length"]) == len(compact)  # UTF-8, no spaces, as httpx's json=


def test_a_nan_in_the_request_is_refused_before_anything_is_sent(server: WireServer, model: OpenAIModel) -> None:
    model.extra_body = {"temperature": float("nan")}
    with pytest.raises(ValueError, match="not JSON compliant"):
        model.complete(USER, [])
    assert server.requests == []


def test_system_and_user_messages_keep_their_roles(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete([{"role": "system", "content": "You write notes."}, *USER], [])
    assert server.requests[0].body["messages"] == [
        {"role": "system", "content": "You write notes."},
        {"role": "user", "content": "Write hi to notes.txt"},
    ]


def test_tools_are_sent_as_functions(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete(USER, [WRITE_SPEC])
    assert server.requests[0].body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "write",
                "description": "Write a file.",
                "parameters": WRITE_SPEC["parameters"],
            },
        }
    ]


def test_no_tools_key_when_the_agent_has_no_tools(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete(USER, [])
    assert "tools" not in server.requests[0].body


def test_assistant_tool_calls_and_results_are_converted(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("done")))
    transcript: list[dict[str, Any]] = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_a", "name": "read", "args": {"path": "a.txt"}},
                {"id": "call_b", "name": "write", "args": {"path": "b.txt", "content": "hé"}},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 6},
        },
        {"role": "tool", "tool_call_id": "call_a", "name": "read", "content": {"content": "x"}},
        {"role": "tool", "tool_call_id": "call_b", "name": "write", "content": {"error": "denied"}},
    ]
    model.complete(transcript, [READ_SPEC, WRITE_SPEC])
    sent = server.requests[0].body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}},
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "write", "arguments": '{"path": "b.txt", "content": "hé"}'},
            },
        ],
    }
    assert sent[2] == {"role": "tool", "tool_call_id": "call_a", "content": '{"content": "x"}'}
    assert sent[3] == {"role": "tool", "tool_call_id": "call_b", "content": '{"error": "denied"}'}


def test_extra_body_and_headers_are_sent(server: WireServer, client: httpx.Client | None) -> None:
    server.play(Answer(body=text("ok")))
    model = OpenAIModel(
        "gpt-4.1-mini",
        base_url=server.url + "/v1",
        client=client,
        headers={"HTTP-Referer": "https://example.org"},
        extra_body={"temperature": 0},
    )
    model.complete(USER, [])
    assert server.requests[0].body["temperature"] == 0
    assert server.requests[0].headers["http-referer"] == "https://example.org"


# --- parsing -----------------------------------------------------------------------------


def test_text_reply_and_usage_are_parsed(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("Hello there.", prompt=19, completion_=10)))
    result = model.complete(USER, [])
    assert result.message == {"role": "assistant", "content": "Hello there."}
    assert result.usage == {"input_tokens": 19, "output_tokens": 10}


def test_one_tool_call_is_parsed(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=calls(("call_Dn2RJJSxzDm49vlVTehseJ0k", "write", '{"path":"notes.txt","content":"hi"}'))))
    result = model.complete(USER, [WRITE_SPEC])
    assert result.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_Dn2RJJSxzDm49vlVTehseJ0k", "name": "write", "args": {"path": "notes.txt", "content": "hi"}}],
    }


def test_parallel_tool_calls_are_parsed_in_order(server: WireServer, model: OpenAIModel) -> None:
    server.play(
        Answer(
            body=calls(
                ("call_1", "read", '{"path": "a.txt"}'),
                ("call_2", "read", '{"path": "b.txt"}'),
                ("call_3", "write", '{"path": "c.txt", "content": ""}'),
            )
        )
    )
    result = model.complete(USER, [READ_SPEC, WRITE_SPEC])
    assert [(c["id"], c["name"], c["args"]) for c in result.message["tool_calls"]] == [
        ("call_1", "read", {"path": "a.txt"}),
        ("call_2", "read", {"path": "b.txt"}),
        ("call_3", "write", {"path": "c.txt", "content": ""}),
    ]


def test_bad_json_arguments_become_a_call_error(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=calls(("call_x", "write", '{"path": "notes.txt", "content": '))))
    [call] = model.complete(USER, [WRITE_SPEC]).message["tool_calls"]
    assert call["args"] == {}
    assert call["error"].startswith("invalid JSON arguments")
    assert call["name"] == "write" and call["id"] == "call_x"


def test_arguments_that_are_not_an_object_become_a_call_error(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=calls(("call_x", "read", '["a.txt"]'))))
    [call] = model.complete(USER, [READ_SPEC]).message["tool_calls"]
    assert call["args"] == {}
    assert "expected an object, got list" in call["error"]


def test_a_non_json_success_body_is_a_model_error(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body="<html>proxy login</html>"))
    with pytest.raises(ModelError, match="openai: .*not a JSON object"):
        model.complete(USER, [])


# --- errors and retries ------------------------------------------------------------------


def test_429_then_success_waits_as_retry_after_says(server: WireServer, model: OpenAIModel, sleeps: list[float]) -> None:
    limited = api_error("Rate limit reached for gpt-4.1-mini on tokens per min (TPM).", "tokens", "rate_limit_exceeded")
    server.play(Answer(429, limited, {"retry-after": "1.5"}), Answer(body=text("ok")))
    result = model.complete(USER, [])
    assert result.message["content"] == "ok"
    assert sleeps == [1.5]
    assert len(server.requests) == 2


def test_retry_after_ms_takes_precedence(server: WireServer, model: OpenAIModel, sleeps: list[float]) -> None:
    limited = api_error("Rate limit reached.", "requests", "rate_limit_exceeded")
    server.play(Answer(429, limited, {"retry-after-ms": "250", "retry-after": "1"}), Answer(body=text("ok")))
    model.complete(USER, [])
    assert sleeps == [0.25]


def test_retry_after_as_an_http_date_is_honoured(server: WireServer, model: OpenAIModel, sleeps: list[float]) -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    server.play(Answer(503, api_error("Slow down", "server_error"), {"retry-after": when}), Answer(body=text("ok")))
    model.complete(USER, [])
    [waited] = sleeps
    assert 28 <= waited <= 30


def test_429_with_the_real_sleep_succeeds(server: WireServer, client: httpx.Client | None) -> None:
    model = OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", client=client)
    server.play(Answer(429, api_error("Rate limit", "requests"), {"retry-after": "0.01"}), Answer(body=text("ok")))
    started = time.monotonic()
    assert model.complete(USER, []).message["content"] == "ok"
    assert time.monotonic() - started < 2


def test_500s_exhausted_raise_a_model_error(server: WireServer, client: httpx.Client | None, sleeps: list[float]) -> None:
    model = OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", client=client, max_retries=2, sleep=sleeps.append)
    failure = api_error("The server had an error while processing your request. Sorry about that!", "server_error")
    server.play(*[Answer(500, failure) for _ in range(3)])
    with pytest.raises(ProviderError) as caught:
        model.complete(USER, [])
    assert caught.value.status == 500
    assert caught.value.provider == "openai"
    assert "The server had an error" in str(caught.value)
    assert "gave up after 3 attempts" in str(caught.value)
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and all(0 < s <= 8 for s in sleeps)


def test_400_names_the_provider_and_its_message_and_is_not_retried(server: WireServer, model: OpenAIModel) -> None:
    body = api_error(
        "Invalid 'messages[0].content': string too long.",
        "invalid_request_error",
        "string_above_max_length",
        "messages[0].content",
    )
    server.play(Answer(400, body))
    with pytest.raises(ModelError) as caught:
        model.complete(USER, [])
    assert str(caught.value).startswith("openai: HTTP 400")
    assert "Invalid 'messages[0].content': string too long." in str(caught.value)
    assert len(server.requests) == 1


def test_a_spent_quota_429_is_not_retried(server: WireServer, model: OpenAIModel, sleeps: list[float]) -> None:
    body = api_error("You exceeded your current quota.", "insufficient_quota", "insufficient_quota")
    server.play(Answer(429, body, {"retry-after": "1"}))
    with pytest.raises(ModelError, match="exceeded your current quota"):
        model.complete(USER, [])
    assert sleeps == []
    assert len(server.requests) == 1


def test_a_retry_after_beyond_the_bound_fails_at_once(server: WireServer, model: OpenAIModel, sleeps: list[float]) -> None:
    server.play(Answer(429, api_error("Rate limit", "requests"), {"retry-after": "3600"}))
    with pytest.raises(ModelError, match="retry after 3600 s, longer than max_retry_wait=60 s"):
        model.complete(USER, [])
    assert sleeps == []


def test_a_refused_connection_is_retried_then_reported(client: httpx.Client | None, sleeps: list[float]) -> None:
    model = OpenAIModel("m", base_url=f"http://127.0.0.1:{free_port()}/v1", client=client, max_retries=2, sleep=sleeps.append)
    with pytest.raises(ModelError, match=r"openai: could not reach .* after 3 attempt\(s\): ConnectError"):
        model.complete(USER, [])
    assert len(sleeps) == 2


def test_a_slow_server_hits_the_timeout(server: WireServer, client: httpx.Client | None) -> None:
    server.play(Answer(body=text("late"), delay=1.0))
    model = OpenAIModel("m", base_url=server.url + "/v1", client=client, timeout=0.2, max_retries=0)
    started = time.monotonic()
    with pytest.raises(ModelError, match="ReadTimeout"):
        model.complete(USER, [])
    assert time.monotonic() - started < 1.0


def test_the_api_key_never_appears_in_an_error(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(401, api_error("Incorrect API key provided: sk-test-123.", "invalid_request_error", "invalid_api_key")))
    with pytest.raises(ModelError) as caught:
        model.complete(USER, [])
    assert "sk-test-123" not in str(caught.value)
    assert "[redacted]" in str(caught.value)
    assert "sk-test-123" not in repr(model)


# --- configuration -----------------------------------------------------------------------


def test_no_key_for_api_openai_com_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r'OPENAI_API_KEY.*NEXO\["PROVIDERS"\]'):
        OpenAIModel("gpt-4.1-mini")


def test_a_local_server_needs_no_key(server: WireServer, client: httpx.Client | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.play(Answer(body=text("ok")))
    OpenAIModel("llama3.2", base_url=server.url + "/v1", client=client).complete(USER, [])
    assert "authorization" not in server.requests[0].headers


def test_key_and_base_url_come_from_the_environment(
    server: WireServer, client: httpx.Client | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/custom/v1/")
    server.play(Answer(body=text("ok")))
    OpenAIModel("gpt-4.1-mini", client=client).complete(USER, [])
    assert server.requests[0].path == "/custom/v1/chat/completions"
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


def test_a_base_url_that_is_not_http_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="must be an http:// or https:// URL"):
        OpenAIModel("m", base_url="ftp://example.org/v1")


def test_resolve_model_passes_provider_settings(server: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = resolve_model("openai:gpt-4.1-mini", {"openai": {"base_url": server.url + "/v1", "api_key": "sk-set"}})
    assert isinstance(model, OpenAIModel)
    server.play(Answer(body=text("ok")))
    model.complete(USER, [])
    assert server.requests[0].headers["authorization"] == "Bearer sk-set"


def test_turns_reuse_one_connection(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=text("one")), Answer(body=text("two")))
    model.complete(USER, [])
    model.complete(USER, [])
    first, second = server.requests
    assert first.client_port == second.client_port


# --- end to end through the loop ---------------------------------------------------------


def test_an_agent_runs_a_tool_call_then_answers(server: WireServer) -> None:
    server.play(
        Answer(body=calls(("call_w1", "write", json.dumps({"path": "notes.txt", "content": "hi"})))),
        Answer(body=text("Wrote notes.txt.", prompt=120, completion_=8)),
    )

    class Scribe(Agent):
        model = OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", api_key="sk-e2e", timeout=5)
        permissions = "auto"
        sandbox = "virtual"
        instructions = "You write notes."

    agent = Scribe()
    result = agent.prompt("Write hi to notes.txt")
    assert result.content == "Wrote notes.txt."
    assert agent.workspace.files == {"notes.txt": b"hi"}  # type: ignore[attr-defined]
    assert result.usage == {"input_tokens": 82 + 120, "output_tokens": 17 + 8}
    first, second = (r.body for r in server.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["read", "glob", "write"]
    assert first["messages"][0] == {"role": "system", "content": "You write notes."}
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_w1"
    tool_message = second["messages"][3]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_w1"
    assert json.loads(tool_message["content"])["path"] == "notes.txt"


def test_an_agent_gets_bad_arguments_back_as_an_error(server: WireServer) -> None:
    server.play(
        Answer(body=calls(("call_bad", "write", '{"path": "notes.txt",'))),
        Answer(body=text("Sorry.")),
    )

    class Scribe(Agent):
        model = OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", timeout=5)
        permissions = "auto"

    agent = Scribe()
    result = agent.prompt("Write hi")
    assert result.content == "Sorry."
    assert agent.workspace.files == {}  # type: ignore[attr-defined]
    tool_message = server.requests[1].body["messages"][2]
    assert tool_message["tool_call_id"] == "call_bad"
    assert "invalid JSON arguments" in json.loads(tool_message["content"])["error"]


# --- opaque parts: Gemini thought signatures, OpenRouter reasoning_details -------------------

GEMINI_SIGNATURE = "CiQBcsjafBIHUVd8ll3ywVDgFzaXPTWVPtdSWgA2Kgq5OClI4ksKXwFyyNp8" + "Q" * 30


def gemini_calls(*calls_: tuple[str, str, str, str | None]) -> dict[str, Any]:
    """A tool-calling turn as Gemini's OpenAI-compatible endpoint sends it: each call may carry
    its thought signature in ``extra_content.google.thought_signature``."""
    tool_calls = []
    for id_, name, arguments, signature in calls_:
        call: dict[str, Any] = {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
        if signature is not None:
            call["extra_content"] = {"google": {"thought_signature": signature}}
        tool_calls.append(call)
    return completion({"content": None, "tool_calls": tool_calls}, "tool_calls")


@pytest.fixture
def gemini_server() -> Iterator[WireServer]:
    with WireServer(rules=GeminiRules()) as wire:
        yield wire


def test_the_wire_server_refuses_a_call_sent_back_without_its_thought_signature(
    gemini_server: WireServer, client: httpx.Client
) -> None:
    gemini_server.play(Answer(body=gemini_calls(("function-call-1", "read", '{"path": "a"}', GEMINI_SIGNATURE))))
    model = OpenAIModel("gemini-3-pro-preview", base_url=gemini_server.url + "/v1beta/openai", client=client)
    reply = model.complete(USER, []).message
    del reply["opaque"]  # what the seed did: the signature is lost
    transcript = [*USER, reply, {"role": "tool", "tool_call_id": "function-call-1", "name": "read", "content": {}}]
    with pytest.raises(ProviderError, match="missing a thought_signature") as caught:
        model.complete(transcript, [])
    assert caught.value.status == 400


def test_gemini_thought_signatures_go_back_on_their_tool_calls(gemini_server: WireServer) -> None:
    gemini_server.play(
        Answer(body=gemini_calls(
            ("function-call-1", "write", '{"path": "a.txt", "content": "A"}', GEMINI_SIGNATURE),
            ("function-call-2", "write", '{"path": "b.txt", "content": "B"}', None),  # parallel: only the first is signed
        )),
        Answer(body=text("Both written.")),
    )

    class Writer(Agent):
        model = OpenAIModel("gemini-3-pro-preview", base_url=gemini_server.url + "/v1beta/openai", api_key="g", timeout=5)
        sandbox = "virtual"
        permissions = "auto"

    agent = Writer()
    assert agent.prompt("write both").content == "Both written."
    assert agent.workspace.files == {"a.txt": b"A", "b.txt": b"B"}  # type: ignore[attr-defined]
    sent = gemini_server.requests[1].body["messages"][1]["tool_calls"]
    assert sent[0]["extra_content"] == {"google": {"thought_signature": GEMINI_SIGNATURE}}
    assert "extra_content" not in sent[1]


def test_openrouter_reasoning_details_go_back_unchanged(server: WireServer, client: httpx.Client | None) -> None:
    details = [
        {"type": "reasoning.text", "text": "Read the file first.", "signature": "sig-or-1", "format": "anthropic-claude-v1", "index": 0},
        {"type": "reasoning.encrypted", "data": "gAAAAABo...", "format": "openai-responses-v1", "index": 1},
    ]
    turn = completion({
        "content": None, "reasoning": "Read the file first.", "reasoning_details": details,
        "tool_calls": [{"id": "call_r", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}],
    }, "tool_calls")
    server.play(Answer(body=turn), Answer(body=text("ok")))
    model = OpenAIModel("anthropic/claude-sonnet-4.5", base_url=server.url + "/api/v1", client=client)
    reply = model.complete(USER, []).message
    model.complete([*USER, reply, {"role": "tool", "tool_call_id": "call_r", "name": "read", "content": {}}], [])
    sent = server.requests[1].body["messages"][1]
    assert sent["reasoning_details"] == details
    assert "reasoning" not in sent  # only what the server asks back is sent


def test_opaque_parts_never_go_to_another_server(server: WireServer, client: httpx.Client | None) -> None:
    reply = {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "name": "read", "args": {"path": "a"}}],
        "opaque": {"provider": "openai", "host": "generativelanguage.googleapis.com",
                   "message": {"reasoning_details": [{"type": "reasoning.text", "text": "x"}]},
                   "tool_calls": [{"extra_content": {"google": {"thought_signature": GEMINI_SIGNATURE}}}]},
    }
    server.play(Answer(body=text("ok")))
    OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", client=client).complete([*USER, reply], [])
    sent = server.requests[0].body["messages"][1]
    assert "reasoning_details" not in sent and "extra_content" not in sent["tool_calls"][0]


def test_anthropic_opaque_parts_are_not_sent_to_an_openai_server(server: WireServer, model: OpenAIModel) -> None:
    reply = {"role": "assistant", "content": "Hi.", "opaque": {"provider": "anthropic", "host": "127.0.0.1",
                                                              "content": [{"block": {"type": "thinking"}}]}}
    server.play(Answer(body=text("ok")))
    model.complete([*USER, reply, {"role": "user", "content": "again"}], [])
    assert server.requests[0].body["messages"][1] == {"role": "assistant", "content": "Hi."}


# --- finish reasons --------------------------------------------------------------------------


def test_a_tool_call_cut_off_by_length_never_runs_and_the_model_is_told(server: WireServer) -> None:
    cut = completion({"content": None, "tool_calls": [
        {"id": "call_cut", "type": "function", "function": {"name": "write", "arguments": '{"path": "notes.txt", "content": "a"}'}}
    ]}, "length")
    server.play(Answer(body=cut), Answer(body=text("Stopping.")))

    class Writer(Agent):
        model = OpenAIModel("gpt-4.1-mini", base_url=server.url + "/v1", api_key="k", timeout=5)
        sandbox = "virtual"
        permissions = "auto"

    agent = Writer()
    result = agent.prompt("write")
    # Even arguments that happen to parse are not trusted: the reply stopped before it was done.
    assert agent.workspace.files == {}  # type: ignore[attr-defined]
    assert 'finish_reason "length"' in result.tool_calls[0].result["error"]
    tool_message = server.requests[1].body["messages"][-1]
    assert tool_message["role"] == "tool" and "cut off" in tool_message["content"]


def test_an_empty_reply_cut_off_by_length_says_why(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=completion({"content": ""}, "length")))
    with pytest.raises(ProviderError, match='empty: it was cut off at the output token limit \\(finish_reason "length"\\)'):
        model.complete(USER, [])


def test_an_empty_reply_stopped_by_the_content_filter_says_why(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=completion({"content": None}, "content_filter")))
    with pytest.raises(ProviderError, match="content filter stopped it \\(finish_reason \"content_filter\"\\)"):
        model.complete(USER, [])


def test_a_truncated_text_answer_is_kept_and_marked(server: WireServer, model: OpenAIModel) -> None:
    server.play(Answer(body=completion({"content": "The first half"}, "length")))
    reply = model.complete(USER, []).message
    assert reply["content"] == "The first half"
    assert reply["stop_reason"] == "length"
