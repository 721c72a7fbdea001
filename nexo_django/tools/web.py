"""``fetch`` and ``search``: the web tools. The SSRF guard lives in ``netguard``."""

from __future__ import annotations

from typing import Any

from .base import Tool, ToolContext, error


def _fetch(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    from .netguard import guarded_fetch

    return guarded_fetch(args["url"], allow=ctx.fetch_allow, limits=ctx.limits)


def _search(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    if ctx.search_backend is None:
        return error("search: no search backend is configured for this agent")
    return {"query": args["query"], "results": []}


FETCH = Tool(
    "fetch",
    "GET a web page from an allowed host and return its text.",
    {
        "type": "object",
        "properties": {"url": {"type": "string", "description": "An http(s) URL."}},
        "required": ["url"],
        "additionalProperties": False,
    },
    capability="fetch",
    idempotent=True,
    run=_fetch,
    detail=lambda args: args.get("url"),
)

SEARCH = Tool(
    "search",
    "Search the web; returns titles, URLs and snippets.",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
        "additionalProperties": False,
    },
    capability="search",
    idempotent=True,
    run=_search,
    detail=lambda args: args.get("query"),
)
