"""``search``: the agent's backend is called with the query and a limit; results are normalised
and capped; a failing backend is an ``{"error"}`` for the model, never a crash. Agent tests use a
scripted model."""

from __future__ import annotations

from typing import Any

import pytest

from nexo_django import Agent, Permissions
from nexo_django.core.sandboxes import VirtualSandbox
from nexo_django.core.tools.base import Limits, ToolContext
from nexo_django.core.tools.web import SEARCH, normalise_results
from nexo_django.testing import ScriptedModel, reply, tool_call

CALLS: list[tuple[str, int]] = []


def settings_backend(query: str, limit: int) -> list[dict[str, str]]:
    """Named by a dotted path in NEXO["SEARCH_BACKEND"]."""
    CALLS.append((query, limit))
    return [{"title": "From settings", "url": "https://example.com/s", "snippet": query}]


def run_search(backend: Any, query: str = "django agents", **limits: Any) -> dict[str, Any]:
    ctx = ToolContext(
        sandbox=VirtualSandbox(),
        permissions=Permissions("auto"),
        limits=Limits(**limits),
        search_backend=backend,
    )
    return SEARCH.invoke({"query": query}, ctx)


def test_the_backend_gets_the_query_and_the_result_limit() -> None:
    seen: list[tuple[str, int]] = []

    def backend(query: str, limit: int) -> list[dict[str, str]]:
        seen.append((query, limit))
        return []

    run_search(backend, "  django \n agents ", search_max_results=7)
    assert seen == [("django agents", 7)]


def test_results_are_normalised_to_title_url_snippet() -> None:
    class Hit:
        title = "An object"
        url = "https://example.com/o"
        snippet = "with attributes"

    raw = [
        {"title": "A dict", "url": "https://example.com/a", "snippet": "text", "score": 0.9},
        {"title": "Uses link/content", "link": "https://example.com/b", "content": "body"},
        Hit(),
    ]
    result = run_search(lambda q, n: raw)
    assert result == {
        "query": "django agents",
        "results": [
            {"title": "A dict", "url": "https://example.com/a", "snippet": "text"},
            {"title": "Uses link/content", "url": "https://example.com/b", "snippet": "body"},
            {"title": "An object", "url": "https://example.com/o", "snippet": "with attributes"},
        ],
    }


def test_a_mapping_with_a_results_key_is_accepted() -> None:
    result = run_search(lambda q, n: {"results": [{"title": "t", "url": "https://e.com/", "snippet": "s"}]})
    assert result["results"] == [{"title": "t", "url": "https://e.com/", "snippet": "s"}]


def test_the_count_is_capped_even_when_the_backend_ignores_the_limit() -> None:
    many = [{"title": str(i), "url": f"https://example.com/{i}", "snippet": ""} for i in range(50)]
    result = run_search(lambda q, n: many, search_max_results=3)
    assert [r["title"] for r in result["results"]] == ["0", "1", "2"]


def test_snippets_are_capped_and_marked() -> None:
    result = run_search(lambda q, n: [{"title": "t", "url": "https://e.com/", "snippet": "word " * 100}], search_snippet_chars=20)
    snippet = result["results"][0]["snippet"]
    assert len(snippet) == 20
    assert snippet.endswith("…")


def test_results_without_a_url_are_dropped() -> None:
    result = run_search(lambda q, n: [{"title": "no link"}, {"title": "ok", "url": "https://e.com/"}])
    assert [r["title"] for r in result["results"]] == ["ok"]


def test_a_backend_that_raises_gives_an_error() -> None:
    def broken(query: str, limit: int) -> list[Any]:
        raise ConnectionError("search service is down")

    result = run_search(broken)
    assert result == {"error": "search failed: the backend raised ConnectionError: search service is down"}


@pytest.mark.parametrize("raw", ["a string", 42, {"no": "results key"}])
def test_a_backend_returning_the_wrong_shape_gives_an_error(raw: Any) -> None:
    assert "search failed" in run_search(lambda q, n: raw)["error"]


def test_an_empty_query_is_refused_before_the_backend_is_called() -> None:
    called: list[str] = []
    result = run_search(lambda q, n: called.append(q) or [], "   ")
    assert result == {"error": "search: the query is empty"}
    assert called == []


def test_normalise_results_treats_none_as_no_results() -> None:
    assert normalise_results(None, max_results=5, snippet_chars=10) == []


# --- inside an agent (scripted model) -----------------------------------------------------------


def failing_backend(query: str, limit: int) -> list[Any]:
    raise RuntimeError("quota exceeded")


class Researcher(Agent):
    permissions = "auto"
    search_backend = staticmethod(failing_backend)


class NoBackend(Agent):
    permissions = "auto"


def test_scripted_agent_without_a_backend_has_no_search_tool() -> None:
    model = ScriptedModel([reply("ok")])
    NoBackend(model=model).prompt("find")
    assert "search" not in model.requests[0]["tools"]


def test_scripted_read_only_agent_without_a_search_grant_has_no_search_tool() -> None:
    model = ScriptedModel([reply("ok")])
    Researcher(model=model, permissions="read_only").prompt("find")
    assert "search" not in model.requests[0]["tools"]


def test_scripted_failing_backend_gives_an_error_and_the_loop_finishes() -> None:
    model = ScriptedModel([tool_call("search", query="nexo"), reply("no luck")])
    answer = Researcher(model=model).prompt("find")
    assert answer.tool_calls[0].result == {"error": "search failed: the backend raised RuntimeError: quota exceeded"}
    assert answer.content == "no luck"


def test_scripted_backend_from_settings_dotted_path(settings: Any) -> None:
    settings.NEXO = {"SEARCH_BACKEND": "tests.core.test_search.settings_backend", "LIMITS": {"search_max_results": 4}}
    CALLS.clear()
    model = ScriptedModel([tool_call("search", query="nexo"), reply("found")])
    answer = NoBackend(model=model).prompt("find")
    assert "search" in model.requests[0]["tools"]
    assert answer.tool_calls[0].result["results"][0]["title"] == "From settings"
    assert CALLS == [("nexo", 4)]
