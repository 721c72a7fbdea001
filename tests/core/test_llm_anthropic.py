"""The Anthropic Messages provider, over real HTTP against a loopback server.

Fixtures follow the public API reference (docs.anthropic.com, Messages and tool use): the
response ``content`` is a list of ``text``/``tool_use`` blocks (``input`` is an object), a
tool-calling turn ends with ``stop_reason: "tool_use"``, usage is ``input_tokens``/
``output_tokens`` (+ prompt-cache counts), tool results go back as ``tool_result`` blocks in a
user turn, and errors are ``{"type": "error", "error": {"type", "message"}, "request_id"}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nexo_django import Agent, ConfigurationError
from nexo_django.core.errors import ModelError
from nexo_django.core.llm import resolve_model
from nexo_django.core.llm.anthropic import AnthropicModel
from nexo_django.core.llm.http import ProviderError
from tests.wire_server import Answer, WireServer

WRITE_SPEC = {
    "name": "write",
    "description": "Write a file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


def message(
    blocks: list[dict[str, Any]], stop_reason: str, input_tokens: int = 472, output_tokens: int = 89, **cache: int
) -> dict[str, Any]:
    return {
        "id": "msg_01Aq9w938a90dw8q",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": cache.get("creation", 0),
            "cache_read_input_tokens": cache.get("read", 0),
            "service_tier": "standard",
        },
    }


def text(content: str, **usage: int) -> dict[str, Any]:
    return message([{"type": "text", "text": content}], "end_turn", **usage)


def tool_use(id_: str, name: str, input_: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": name, "input": input_}


def api_error(kind: str, text_: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": text_, **extra}, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client() as http_client:
        yield http_client


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def model(server: WireServer, client: httpx.Client, sleeps: list[float]) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-5", api_key="sk-ant-test-9", base_url=server.url, client=client, timeout=5, sleep=sleeps.append
    )


USER = [{"role": "user", "content": "Write hi to notes.txt"}]


# --- requests ----------------------------------------------------------------------------


def test_request_goes_to_messages_with_key_and_version_headers(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete(USER, [])
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test-9"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in request.headers
    assert request.body["model"] == "claude-sonnet-4-5"
    assert request.body["max_tokens"] == 4096


def test_system_messages_go_to_the_top_level_system(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete([{"role": "system", "content": "You write notes."}, {"role": "system", "content": "Be brief."}, *USER], [])
    body = server.requests[0].body
    assert body["system"] == "You write notes.\n\nBe brief."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Write hi to notes.txt"}]}]


def test_tools_are_sent_with_input_schema(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("ok")))
    model.complete(USER, [WRITE_SPEC])
    assert server.requests[0].body["tools"] == [
        {"name": "write", "description": "Write a file.", "input_schema": WRITE_SPEC["parameters"]}
    ]
    assert "system" not in server.requests[0].body


def test_tool_calls_and_grouped_tool_results_are_converted(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("done")))
    transcript: list[dict[str, Any]] = [
        *USER,
        {
            "role": "assistant",
            "content": "I'll read both.",
            "tool_calls": [
                {"id": "toolu_a", "name": "read", "args": {"path": "a.txt"}},
                {"id": "toolu_b", "name": "write", "args": {"path": "b.txt", "content": "x"}},
            ],
            "usage": {"input_tokens": 1, "output_tokens": 2},
        },
        {"role": "tool", "tool_call_id": "toolu_a", "name": "read", "content": {"content": "x"}},
        {"role": "tool", "tool_call_id": "toolu_b", "name": "write", "content": {"error": "write denied"}},
    ]
    model.complete(transcript, [WRITE_SPEC])
    sent = server.requests[0].body["messages"]
    assert len(sent) == 3
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "I'll read both."},
            {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a.txt"}},
            {"type": "tool_use", "id": "toolu_b", "name": "write", "input": {"path": "b.txt", "content": "x"}},
        ],
    }
    assert sent[2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": '{"content": "x"}'},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": '{"error": "write denied"}', "is_error": True},
        ],
    }


def test_an_assistant_turn_with_only_tool_calls_sends_no_empty_text(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("done")))
    transcript: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "toolu_a", "name": "read", "args": {"path": "a"}}]},
        {"role": "tool", "tool_call_id": "toolu_a", "name": "read", "content": {"content": ""}},
        {"role": "user", "content": "And now?"},
    ]
    model.complete(transcript, [])
    sent = server.requests[0].body["messages"]
    assert [block["type"] for block in sent[1]["content"]] == ["tool_use"]
    # Tool results come first in their user turn; a following user text joins that turn.
    assert [block["type"] for block in sent[2]["content"]] == ["tool_result", "text"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]


def test_max_tokens_and_extra_body_are_sent(server: WireServer, client: httpx.Client) -> None:
    server.play(Answer(body=text("ok")))
    model = AnthropicModel(
        "claude-haiku-4-5", base_url=server.url, client=client, max_tokens=512, extra_body={"temperature": 0.2}
    )
    model.complete(USER, [])
    assert server.requests[0].body["max_tokens"] == 512
    assert server.requests[0].body["temperature"] == 0.2


# --- parsing -----------------------------------------------------------------------------


def test_text_reply_and_usage_are_parsed(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("Hello.", input_tokens=25, output_tokens=4)))
    result = model.complete(USER, [])
    assert result.message == {"role": "assistant", "content": "Hello."}
    assert result.usage == {"input_tokens": 25, "output_tokens": 4}


def test_prompt_cache_tokens_count_as_input(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=text("Hello.", input_tokens=10, output_tokens=4, creation=100, read=1000)))
    assert model.complete(USER, []).usage == {"input_tokens": 1110, "output_tokens": 4}


def test_text_and_a_tool_use_are_parsed(server: WireServer, model: AnthropicModel) -> None:
    blocks = [
        {"type": "text", "text": "I'll write the note."},
        tool_use("toolu_01A09q90qw90lq917835lq9", "write", {"path": "notes.txt", "content": "hi"}),
    ]
    server.play(Answer(body=message(blocks, "tool_use")))
    result = model.complete(USER, [WRITE_SPEC])
    assert result.message == {
        "role": "assistant",
        "content": "I'll write the note.",
        "tool_calls": [{"id": "toolu_01A09q90qw90lq917835lq9", "name": "write", "args": {"path": "notes.txt", "content": "hi"}}],
    }


def test_parallel_tool_uses_are_parsed_in_order(server: WireServer, model: AnthropicModel) -> None:
    blocks = [
        tool_use("toolu_1", "read", {"path": "a.txt"}),
        tool_use("toolu_2", "glob", {"pattern": "*.py"}),
    ]
    server.play(Answer(body=message(blocks, "tool_use")))
    result = model.complete(USER, [])
    assert result.message["content"] is None
    assert [(c["id"], c["name"], c["args"]) for c in result.message["tool_calls"]] == [
        ("toolu_1", "read", {"path": "a.txt"}),
        ("toolu_2", "glob", {"pattern": "*.py"}),
    ]


def test_tool_uses_without_an_id_get_unique_provider_safe_ids(server: WireServer, model: AnthropicModel) -> None:
    # A compatible proxy may drop ids; two turns must never share one (an approval names one call).
    ids = []
    for _ in range(2):
        server.play(Answer(body=message([{"type": "tool_use", "name": "read", "input": {"path": "a"}}], "tool_use")))
        [call] = model.complete(USER, []).message["tool_calls"]
        ids.append(call["id"])
    assert ids[0] != ids[1]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]+", i) for i in ids)


def test_a_tool_input_that_is_not_an_object_becomes_a_call_error(server: WireServer, model: AnthropicModel) -> None:
    # The real API always sends an object; a compatible proxy may pass a raw string through.
    server.play(Answer(body=message([tool_use("toolu_x", "write", '{"path": "a"')], "tool_use")))
    [call] = model.complete(USER, []).message["tool_calls"]
    assert call["args"] == {}
    assert call["error"].startswith("invalid JSON arguments")


# --- errors and retries ------------------------------------------------------------------


def test_429_then_success_waits_as_retry_after_says(server: WireServer, model: AnthropicModel, sleeps: list[float]) -> None:
    limited = api_error("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")
    server.play(Answer(429, limited, {"retry-after": "2"}), Answer(body=text("ok")))
    assert model.complete(USER, []).message["content"] == "ok"
    assert sleeps == [2.0]
    assert len(server.requests) == 2


def test_529_overloaded_exhausted_raises_a_model_error(server: WireServer, client: httpx.Client, sleeps: list[float]) -> None:
    model = AnthropicModel("claude-sonnet-4-5", base_url=server.url, client=client, max_retries=3, sleep=sleeps.append)
    server.play(*[Answer(529, api_error("overloaded_error", "Overloaded")) for _ in range(4)])
    with pytest.raises(ProviderError) as caught:
        model.complete(USER, [])
    assert caught.value.status == 529
    assert "anthropic: HTTP 529" in str(caught.value) and "overloaded_error: Overloaded" in str(caught.value)
    assert len(server.requests) == 4
    assert len(sleeps) == 3


def test_500s_exhausted_raise_a_model_error(server: WireServer, client: httpx.Client, sleeps: list[float]) -> None:
    model = AnthropicModel("claude-sonnet-4-5", base_url=server.url, client=client, max_retries=1, sleep=sleeps.append)
    server.play(*[Answer(500, api_error("api_error", "Internal server error")) for _ in range(2)])
    with pytest.raises(ModelError, match="Internal server error.*gave up after 2 attempts"):
        model.complete(USER, [])
    assert len(server.requests) == 2


def test_400_names_the_provider_and_its_message_and_is_not_retried(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(400, api_error("invalid_request_error", "messages: text content blocks must be non-empty")))
    with pytest.raises(ProviderError) as caught:
        model.complete(USER, [])
    assert caught.value.status == 400
    assert str(caught.value).startswith("anthropic: HTTP 400")
    assert "invalid_request_error: messages: text content blocks must be non-empty" in str(caught.value)
    assert len(server.requests) == 1


def test_a_spent_limit_429_is_not_retried(server: WireServer, model: AnthropicModel, sleeps: list[float]) -> None:
    body = api_error(
        "rate_limit_error",
        "You have reached your specified API usage limits.",
        details={"error_code": "enforced_spend_limit_reached"},
    )
    server.play(Answer(429, body))
    with pytest.raises(ModelError, match="usage limits"):
        model.complete(USER, [])
    assert sleeps == []
    assert len(server.requests) == 1


def test_the_api_key_never_appears_in_an_error(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(401, api_error("authentication_error", "invalid x-api-key sk-ant-test-9")))
    with pytest.raises(ModelError) as caught:
        model.complete(USER, [])
    assert "sk-ant-test-9" not in str(caught.value)
    assert "authentication_error" in str(caught.value)


# --- configuration -----------------------------------------------------------------------


def test_no_key_for_api_anthropic_com_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match=r'ANTHROPIC_API_KEY.*NEXO\["PROVIDERS"\]'):
        AnthropicModel("claude-sonnet-4-5")


def test_key_and_base_url_come_from_the_environment(
    server: WireServer, client: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url + "/proxy")
    server.play(Answer(body=text("ok")))
    AnthropicModel("claude-sonnet-4-5", client=client).complete(USER, [])
    assert server.requests[0].path == "/proxy/v1/messages"
    assert server.requests[0].headers["x-api-key"] == "sk-ant-env"


def test_a_bad_max_tokens_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="max_tokens must be a positive integer"):
        AnthropicModel("claude-sonnet-4-5", base_url="http://127.0.0.1:9", max_tokens=0)


def test_resolve_model_passes_provider_settings(server: WireServer) -> None:
    options = {"anthropic": {"base_url": server.url, "api_key": "sk-ant-set", "max_tokens": 1024}}
    model = resolve_model("anthropic:claude-sonnet-4-5", options)
    assert isinstance(model, AnthropicModel)
    server.play(Answer(body=text("ok")))
    model.complete(USER, [])
    assert server.requests[0].headers["x-api-key"] == "sk-ant-set"
    assert server.requests[0].body["max_tokens"] == 1024


# --- end to end through the loop ---------------------------------------------------------


def test_an_agent_runs_a_tool_call_then_answers(server: WireServer) -> None:
    server.play(
        Answer(body=message([tool_use("toolu_w1", "write", {"path": "notes.txt", "content": "hi"})], "tool_use", 300, 40)),
        Answer(body=text("Wrote notes.txt.", input_tokens=380, output_tokens=9)),
    )

    class Scribe(Agent):
        model = AnthropicModel("claude-sonnet-4-5", base_url=server.url, api_key="sk-ant-e2e", timeout=5)
        permissions = "auto"
        sandbox = "virtual"
        instructions = "You write notes."

    agent = Scribe()
    result = agent.prompt("Write hi to notes.txt")
    assert result.content == "Wrote notes.txt."
    assert agent.workspace.files == {"notes.txt": b"hi"}  # type: ignore[attr-defined]
    assert result.usage == {"input_tokens": 680, "output_tokens": 49}
    first, second = (r.body for r in server.requests)
    assert first["system"] == "You write notes."
    assert [t["name"] for t in first["tools"]] == ["read", "glob", "write"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    [result_block] = second["messages"][2]["content"]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_w1"
    assert "is_error" not in result_block
    assert json.loads(result_block["content"])["path"] == "notes.txt"
