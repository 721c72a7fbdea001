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
