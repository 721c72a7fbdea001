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
from tests.wire_server import CLIENTS, Answer, AnthropicRules, WireServer, provider_client

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


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> Iterator[httpx.Client | None]:
    yield from provider_client(request.param)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def model(server: WireServer, client: httpx.Client | None, sleeps: list[float]) -> AnthropicModel:
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


def test_max_tokens_and_extra_body_are_sent(server: WireServer, client: httpx.Client | None) -> None:
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


def test_529_overloaded_exhausted_raises_a_model_error(server: WireServer, client: httpx.Client | None, sleeps: list[float]) -> None:
    model = AnthropicModel("claude-sonnet-4-5", base_url=server.url, client=client, max_retries=3, sleep=sleeps.append)
    server.play(*[Answer(529, api_error("overloaded_error", "Overloaded")) for _ in range(4)])
    with pytest.raises(ProviderError) as caught:
        model.complete(USER, [])
    assert caught.value.status == 529
    assert "anthropic: HTTP 529" in str(caught.value) and "overloaded_error: Overloaded" in str(caught.value)
    assert len(server.requests) == 4
    assert len(sleeps) == 3


def test_500s_exhausted_raise_a_model_error(server: WireServer, client: httpx.Client | None, sleeps: list[float]) -> None:
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
    server: WireServer, client: httpx.Client | None, monkeypatch: pytest.MonkeyPatch
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


# --- extended thinking: opaque blocks go back unchanged, to Anthropic only ----------------------

THINKING = {"type": "enabled", "budget_tokens": 2048}
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds" + "x" * 40


def thinking(text_: str = "The user wants a note; I'll write it.", signature: str = SIGNATURE) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text_, "signature": signature}


def redacted(data: str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr") -> dict[str, Any]:
    return {"type": "redacted_thinking", "data": data}


@pytest.fixture
def anthropic_server() -> Iterator[WireServer]:
    """A loopback server that refuses what the Messages API refuses, with its own 400."""
    with WireServer(rules=AnthropicRules()) as wire:
        yield wire


def _thinking_agent(server: WireServer, permissions: str = "auto") -> type[Agent]:
    class Thinker(Agent):
        model = AnthropicModel(
            "claude-sonnet-4-5", base_url=server.url, api_key="sk-ant-t", timeout=5, extra_body={"thinking": THINKING}
        )
        sandbox = "virtual"

    Thinker.permissions = permissions
    return Thinker


def test_the_wire_server_refuses_a_tool_result_after_a_turn_without_its_thinking_block(
    anthropic_server: WireServer, client: httpx.Client
) -> None:
    # The provider's own rule, as the server enforces it: a turn sent back without its thinking
    # block (what the seed did) gets Anthropic's 400.
    model = AnthropicModel("claude-sonnet-4-5", base_url=anthropic_server.url, client=client, extra_body={"thinking": THINKING})
    stripped: list[dict[str, Any]] = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "toolu_1", "name": "read", "args": {"path": "a"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "read", "content": {"content": "x"}},
    ]
    with pytest.raises(ProviderError, match="Expected `thinking` or `redacted_thinking`, but found `tool_use`") as caught:
        model.complete(stripped, [])
    assert caught.value.status == 400


def test_thinking_blocks_are_kept_and_sent_back_before_the_tool_result(anthropic_server: WireServer) -> None:
    blocks = [thinking(), redacted(), tool_use("toolu_t1", "write", {"path": "notes.txt", "content": "hi"})]
    anthropic_server.play(Answer(body=message(blocks, "tool_use")), Answer(body=text("Wrote it.")))
    agent = _thinking_agent(anthropic_server)()
    result = agent.prompt("Write hi to notes.txt")
    assert result.content == "Wrote it."
    assert agent.workspace.files == {"notes.txt": b"hi"}  # type: ignore[attr-defined]
    second = anthropic_server.requests[1].body
    assert second["messages"][1]["content"] == blocks  # verbatim, in order, signatures included
    assert next(m for m in result.transcript if m["role"] == "assistant")["opaque"]["provider"] == "anthropic"


def test_interleaved_thinking_text_and_calls_keep_their_order(anthropic_server: WireServer, client: httpx.Client | None) -> None:
    blocks = [
        thinking("First the file.", SIGNATURE + "1"),
        {"type": "text", "text": "Reading a. "},
        tool_use("toolu_a", "read", {"path": "a"}),
        thinking("Then the other.", SIGNATURE + "2"),
        {"type": "text", "text": "And b."},
        tool_use("toolu_b", "read", {"path": "b"}),
    ]
    anthropic_server.play(Answer(body=message(blocks, "tool_use")), Answer(body=text("ok")))
    model = AnthropicModel("claude-sonnet-4-5", base_url=anthropic_server.url, client=client, extra_body={"thinking": THINKING})
    reply = model.complete(USER, []).message
    assert reply["content"] == "Reading a. And b."
    transcript = [
        *USER, reply,
        {"role": "tool", "tool_call_id": "toolu_a", "name": "read", "content": {"content": "A"}},
        {"role": "tool", "tool_call_id": "toolu_b", "name": "read", "content": {"content": "B"}},
    ]
    model.complete(transcript, [])
    assert anthropic_server.requests[1].body["messages"][1]["content"] == blocks


def test_a_changed_thinking_block_gets_anthropics_400(anthropic_server: WireServer, client: httpx.Client | None) -> None:
    anthropic_server.play(Answer(body=message([thinking(), tool_use("toolu_c", "read", {"path": "a"})], "tool_use")))
    model = AnthropicModel("claude-sonnet-4-5", base_url=anthropic_server.url, client=client, extra_body={"thinking": THINKING})
    reply = model.complete(USER, []).message
    reply["opaque"]["content"][0]["block"]["thinking"] = "edited"
    transcript = [*USER, reply, {"role": "tool", "tool_call_id": "toolu_c", "name": "read", "content": {}}]
    with pytest.raises(ProviderError, match="Invalid `signature` in `thinking` block"):
        model.complete(transcript, [])


def test_thinking_blocks_go_back_only_to_the_host_that_made_them(server: WireServer, client: httpx.Client | None) -> None:
    # The same transcript sent to another Anthropic-compatible host carries no signature of ours.
    reply = {
        "role": "assistant", "content": "Reading.",
        "tool_calls": [{"id": "toolu_1", "name": "read", "args": {"path": "a"}}],
        "opaque": {"provider": "anthropic", "host": "api.anthropic.com",
                   "content": [{"block": thinking()}, {"neutral": "text", "chars": 8}, {"neutral": "tool_use"}]},
    }
    server.play(Answer(body=text("ok")))
    AnthropicModel("claude-sonnet-4-5", base_url=server.url, client=client).complete([*USER, reply], [])
    assert [b["type"] for b in server.requests[0].body["messages"][1]["content"]] == ["text", "tool_use"]


def test_an_openai_reply_with_opaque_parts_sends_nothing_of_them_to_anthropic(server: WireServer, client: httpx.Client | None) -> None:
    reply = {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "name": "read", "args": {"path": "a"}}],
        "opaque": {"provider": "openai", "host": "127.0.0.1", "message": {"reasoning_details": [{"type": "reasoning.text"}]}},
    }
    server.play(Answer(body=text("ok")))
    AnthropicModel("claude-sonnet-4-5", base_url=server.url, client=client).complete([*USER, reply], [])
    assert server.requests[0].body["messages"][1] == {
        "role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "read", "input": {"path": "a"}}]
    }


class ThinkingScribe(Agent):
    """Durable: a gated write after a thinking turn; its model is set by the test (loopback server)."""

    sandbox = "virtual"
    permissions = "approve"


@pytest.mark.django_db(transaction=True)
@pytest.mark.durable
def test_a_durable_run_resumed_after_a_thinking_turn_sends_the_thinking_block_back(
    anthropic_server: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexo_django.models import AgentRun, RunStatus

    monkeypatch.setattr(ThinkingScribe, "model", AnthropicModel(
        "claude-sonnet-4-5", base_url=anthropic_server.url, api_key="sk-ant-d", timeout=5, extra_body={"thinking": THINKING}
    ))
    blocks = [thinking(), tool_use("toolu_d1", "write", {"path": "notes.txt", "content": "hi"})]
    anthropic_server.play(Answer(body=message(blocks, "tool_use")), Answer(body=text("Wrote notes.txt.")))
    run = ThinkingScribe.run("Write hi to notes.txt")
    assert run.status == RunStatus.SUSPENDED
    run.resume(approved=True)
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.DONE, run.error
    assert run.result == "Wrote notes.txt."
    assert anthropic_server.requests[1].body["messages"][1]["content"] == blocks


# --- stop reasons ----------------------------------------------------------------------------


def test_a_tool_use_cut_off_by_max_tokens_never_runs_and_the_model_is_told(anthropic_server: WireServer) -> None:
    # The cut-off call lost the end of its arguments: it must not write anything.
    cut = message([tool_use("toolu_m", "write", {"path": "notes.txt"})], "max_tokens")
    anthropic_server.play(Answer(body=cut), Answer(body=text("I'll stop here.")))

    class Writer(Agent):
        model = AnthropicModel("claude-sonnet-4-5", base_url=anthropic_server.url, api_key="k", timeout=5)
        sandbox = "virtual"
        permissions = "auto"

    agent = Writer()
    result = agent.prompt("Write a note")
    assert agent.workspace.files == {}  # type: ignore[attr-defined]
    assert "max_tokens" in result.tool_calls[0].result["error"]
    [block] = anthropic_server.requests[1].body["messages"][2]["content"]
    assert block["is_error"] is True and 'stop_reason \\"max_tokens\\"' in block["content"]


@pytest.mark.parametrize("reason", ["max_tokens", "model_context_window_exceeded"])
def test_an_empty_reply_cut_off_says_why(server: WireServer, model: AnthropicModel, reason: str) -> None:
    server.play(Answer(body=message([thinking()], reason)))
    with pytest.raises(ProviderError, match=f'empty: it was cut off at the output token limit \\(stop_reason "{reason}"\\)'):
        model.complete(USER, [])


def test_a_refusal_with_empty_content_surfaces_as_the_answer(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=message([], "refusal")))
    reply = model.complete(USER, []).message
    assert reply["content"] == 'The model declined to answer (stop_reason "refusal").'
    assert reply["stop_reason"] == "refusal"


def test_a_refusal_keeps_the_text_it_came_with(server: WireServer, model: AnthropicModel) -> None:
    server.play(Answer(body=message([{"type": "text", "text": "I can't help with that."}], "refusal")))
    assert model.complete(USER, []).message["content"] == "I can't help with that."


def test_pause_turn_continues_the_turn_with_the_paused_content(anthropic_server: WireServer, client: httpx.Client | None) -> None:
    search = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"query": "django 6"}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01",
             "content": [{"type": "web_search_result", "url": "https://www.djangoproject.com/", "title": "Django",
                          "encrypted_content": "EqgfCioIARgBIiQ3YTAw", "page_age": None}]}
    anthropic_server.play(
        Answer(body=message([search], "pause_turn", input_tokens=100, output_tokens=10)),
        Answer(body=message([found, {"type": "text", "text": "Django 6 is out."}], "end_turn", input_tokens=200, output_tokens=20)),
    )
    model = AnthropicModel("claude-sonnet-4-5", base_url=anthropic_server.url, client=client)
    result = model.complete(USER, [])
    assert result.message["content"] == "Django 6 is out."
    assert result.usage == {"input_tokens": 300, "output_tokens": 30}
    first, second = (r.body for r in anthropic_server.requests)
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": [search]}]
    assert [item.get("block", {}).get("type") for item in result.message["opaque"]["content"]] == [
        "server_tool_use", "web_search_tool_result", None
    ]
