"""A run with 10,000 calls in one turn (issue 33, item 2): the admin's run page, the user's run page
and the status JSON the page polls are bounded by count as well as by size: counts by status, the
first calls, links to the rest, and the same number of queries as at 10 calls. The rows are
inserted in bulk (bench.many_calls), not through the loop: what is tested is the pages."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from bench.many_calls import make_run_with_calls, pages
from nexo_django import run_pages

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

#: Far under the 1 MB of the target: what a page of 10,000 small calls should weigh is a window's.
PAGE_BYTES = 200_000
AGENT = "tests.durable_agents.ThreeTurns"


def _get(client: Client, url: str) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return response, len(captured.captured_queries)


def test_pages_of_a_run_with_10000_calls_stay_bounded(admin_user: Any, settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.urls_runs"  # the admin and nexo_django.urls
    client = Client()
    client.force_login(admin_user)
    small = make_run_with_calls(10, agent=AGENT, user=admin_user)
    big = make_run_with_calls(10_000, agent=AGENT, user=admin_user)
    small_pages, big_pages = pages(small), pages(big)
    for page in ("admin_run", "user_run", "status_json"):
        _get(client, small_pages[page])  # warm: sessions, content types
        _, small_queries = _get(client, small_pages[page])
        response, queries = _get(client, big_pages[page])
        assert len(response.content) < PAGE_BYTES, (page, len(response.content))
        # A window costs a few more queries than a run that fits (the counts before and after it),
        # never one per call.
        assert queries <= small_queries + 4, (page, small_queries, queries)

    admin_html = client.get(big_pages["admin_run"]).content.decode()
    assert "pending_approval 5000 · succeeded 5000" in admin_html
    assert f"Calls 1–{run_pages.CALLS_SHOWN} of 10000" in admin_html
    assert admin_html.count("<td><strong>") == run_pages.CALLS_SHOWN
    later = re.search(r'href="\?calls_from=(\d+)#calls" id="calls-later"', admin_html)
    assert later is not None
    next_html = client.get(big_pages["admin_run"] + f"?calls_from={later.group(1)}").content.decode()
    assert f"Calls {run_pages.CALLS_SHOWN + 1}–{2 * run_pages.CALLS_SHOWN} of 10000" in next_html
    assert f"call_{run_pages.CALLS_SHOWN}<" in next_html and "call_0<" not in next_html

    user_html = client.get(big_pages["user_run"]).content.decode()
    assert f"and {5000 - run_pages.CALLS_SHOWN} more calls waiting (5000 in all)" in user_html
    assert f"Messages {5002 - run_pages.MESSAGES_SHOWN + 1}–5002 of 5002" in user_html
    earlier = client.get(big_pages["user_run"] + "?transcript_from=0").content.decode()
    assert "Tidy the notes." in earlier and f"Messages 1–{run_pages.MESSAGES_SHOWN} of 5002" in earlier

    status = client.get(big_pages["status_json"]).json()
    assert status["calls"] == {"pending_approval": 5000, "succeeded": 5000}
    assert status["pending_total"] == 5000 and len(status["pending"]) == run_pages.PENDING_SHOWN
    seen = {p["tool_call_id"] for p in status["pending"]}
    following = client.get(status["pending_next"]).json()
    assert len(following["pending"]) == run_pages.PENDING_SHOWN
    assert not seen & {p["tool_call_id"] for p in following["pending"]}
    assert following["pending"][0]["tool_call_id"] == f"call_{5000 + run_pages.PENDING_SHOWN}"
