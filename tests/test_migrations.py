"""Migrations keep what is stored."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@pytest.mark.django_db(transaction=True)
def test_0003_copies_each_calls_agent_from_its_run() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("nexo_django", "0002_pendingapproval")])
    old = executor.loader.project_state([("nexo_django", "0002_pendingapproval")]).apps
    run = old.get_model("nexo_django", "AgentRun").objects.create(agent="app.agents.Scribe", prompt="p")
    old.get_model("nexo_django", "ToolCall").objects.create(
        run=run, tool_call_id="c1", name="write", capability="write", args={}, digest="d", status="pending_approval"
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("nexo_django"))
    new = executor.loader.project_state(executor.loader.graph.leaf_nodes("nexo_django")).apps
    assert new.get_model("nexo_django", "ToolCall").objects.get().agent == "app.agents.Scribe"


def _run_indexes(table: str) -> list[list[str]]:
    """The column lists of the plain (not unique) indexes on ``table`` that start with run_id."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return sorted(
        info["columns"] for info in found.values()
        if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"][:1] == ["run_id"]
    )  # fmt: skip


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
def test_0006_drops_only_the_run_indexes_a_composite_index_covers_and_back() -> None:
    tables = ["nexo_django_runevent", "nexo_django_runmessage", "nexo_django_toolcall"]
    after = {table: _run_indexes(table) for table in tables}
    assert after == {
        "nexo_django_runevent": [["run_id", "id"]],
        "nexo_django_runmessage": [],  # the unique (run_id, seq) index serves it
        "nexo_django_toolcall": [["run_id", "status", "created_at"]],
    }
    executor = MigrationExecutor(connection)
    executor.migrate([("nexo_django", "0005_toolcall_updated_index")])
    old = executor.loader.project_state([("nexo_django", "0005_toolcall_updated_index")]).apps
    run = old.get_model("nexo_django", "AgentRun").objects.create(agent="app.agents.Scribe", prompt="p")
    old.get_model("nexo_django", "RunEvent").objects.create(run=run, type="created", data={})
    for table in tables:
        assert ["run_id"] in _run_indexes(table), table
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("nexo_django"))
    assert {table: _run_indexes(table) for table in tables} == after
    new = executor.loader.project_state(executor.loader.graph.leaf_nodes("nexo_django")).apps
    assert new.get_model("nexo_django", "RunEvent").objects.get().run_id == run.pk
