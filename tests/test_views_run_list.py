"""The user-facing run list at any size (issue 24, item 11): paginated, a query count that does not
grow, and its newest-first order read from an index, not sorted (SQLite's plan says so). The
timings are bench/inbox.py's (user_runs_page), not a test's."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from nexo_django.models import AgentRun, RunStatus

pytestmark = [pytest.mark.django_db]


def _runs(n: int, user: Any = None) -> None:
    AgentRun.objects.bulk_create(
        AgentRun(agent="tests.durable_agents.Scribe", prompt="p", status=RunStatus.DONE, created_by=user) for _ in range(n)
    )


def _list(client: Client, query: str = "") -> CaptureQueriesContext:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(f"/runs/{query}").status_code == 200
    return captured


def _run_select(captured: CaptureQueriesContext) -> str:
    [sql] = [q["sql"] for q in captured.captured_queries if 'FROM "nexo_django_agentrun"' in q["sql"] and "LIMIT" in q["sql"]]
    return sql


@pytest.mark.parametrize("sees_all", [True, False])
def test_the_run_list_is_paginated_with_a_constant_query_count_and_an_indexed_order(
    sees_all: bool, django_user_model: Any, example: Any
) -> None:
    ann = django_user_model.objects.create_user("ann", is_superuser=sees_all)
    client = Client()
    client.force_login(ann)
    _runs(10, ann)
    small = len(_list(client).captured_queries)
    _runs(300, ann)
    _runs(50)  # someone else's
    captured = _list(client)
    assert len(captured.captured_queries) == small
    assert len(_list(client, "?page=13").captured_queries) == small
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + _run_select(captured))
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "TEMP B-TREE" not in plan, plan
