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


def _column_indexes(table: str, column: str) -> dict[str, bool]:
    """The plain indexes on ``table`` whose only column is ``column``: name -> whether partial."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [table])
            partial = {name: " WHERE " in (sql or "") for name, sql in cursor.fetchall()}
        else:
            cursor.execute("SELECT indexrelid::regclass::text, indpred IS NOT NULL FROM pg_index "
                           "WHERE indrelid = %s::regclass", [table])
            partial = {name.strip('"'): bool(pred) for name, pred in cursor.fetchall()}
    return {
        name: partial[name] for name, info in found.items()
        if info["index"] and not info["unique"] and not info["primary_key"] and info["columns"] == [column]
    }  # fmt: skip


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
def test_0014_drops_the_covered_user_index_makes_parent_and_rule_partial_and_back() -> None:
    columns = [("nexo_django_agentrun", "created_by_id"), ("nexo_django_agentrun", "parent_id"),
               ("nexo_django_decision", "rule_id")]
    after = {column: _column_indexes(*column) for column in columns}
    assert after == {
        ("nexo_django_agentrun", "created_by_id"): {},  # (created_by, created_at) serves it
        ("nexo_django_agentrun", "parent_id"): {"nexo_run_parent": True},
        ("nexo_django_decision", "rule_id"): {"nexo_decision_rule": True},
    }
    executor = MigrationExecutor(connection)
    executor.migrate([("nexo_django", "0013_channels")])
    old = executor.loader.project_state([("nexo_django", "0013_channels")]).apps
    parent = old.get_model("nexo_django", "AgentRun").objects.create(agent="app.agents.Flow", prompt="p")
    old.get_model("nexo_django", "AgentRun").objects.create(agent="app.agents.Scribe", prompt="p", parent=parent)
    for column in columns:  # one full index each again
        assert list(_column_indexes(*column).values()) == [False], column
    assert _call_indexes() == {"nexo_call_status_created", "nexo_call_status_agent", "nexo_call_status_name_cap",
                               "nexo_call_status_expires", "nexo_call_run_status_created", "nexo_call_updated"}
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("nexo_django"))
    assert {column: _column_indexes(*column) for column in columns} == after
    assert _call_indexes() == {"nexo_call_pending_created", "nexo_call_pending_agent", "nexo_call_pending_name_cap",
                               "nexo_call_pending_expires", "nexo_call_run_status_created", "nexo_call_updated"}
    new = executor.loader.project_state(executor.loader.graph.leaf_nodes("nexo_django")).apps
    assert new.get_model("nexo_django", "AgentRun").objects.filter(parent_id=parent.pk).count() == 1


def _call_indexes() -> set[str]:
    """The names of ToolCall's plain indexes of more than the run's key (named by the models)."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "nexo_django_toolcall")
    return {name for name, info in found.items() if info["index"] and not info["unique"] and not info["primary_key"]}


@pytest.mark.django_db
def test_a_lookup_by_parent_or_rule_uses_its_partial_index_on_sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plan; PostgreSQL's depends on its statistics")
    from nexo_django.models import AgentRun, Decision

    assert "nexo_run_parent" in AgentRun.objects.filter(parent_id="0" * 32).explain()
    assert "nexo_decision_rule" in Decision.objects.filter(rule_id__in=[1, 2]).explain()


@pytest.mark.django_db
def test_the_inbox_and_the_reconciler_read_the_partial_indexes_of_pending_calls_on_sqlite() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's plans; PostgreSQL's depend on its statistics")
    from django.utils import timezone

    from nexo_django.models import CallStatus, ToolCall

    pending = ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL)
    assert "nexo_call_pending_created" in pending.order_by("created_at", "id").explain()
    assert "nexo_call_pending_agent" in pending.order_by("agent").values_list("agent").explain()
    assert "nexo_call_pending_name_cap" in pending.filter(name="write").order_by("capability").values("capability").explain()
    # durable.expiry's query of overdue calls
    assert "nexo_call_pending_expires" in pending.filter(expires_at__lte=timezone.now()).order_by("expires_at", "id").explain()


@pytest.mark.django_db(transaction=True)
def test_0017_folds_the_wait_histogram_into_one_row_per_key_and_back() -> None:
    """A bucket per row (0016) becomes a column per bucket of one row per key, the longest
    waits in the last; going back spreads them out again."""
    executor = MigrationExecutor(connection)
    executor.migrate([("nexo_django", "0016_insight")])
    old = executor.loader.project_state([("nexo_django", "0016_insight")]).apps.get_model("nexo_django", "InsightWait")
    key = {"grain": "d", "day": "2026-12-01", "agent": "app.agents.Scribe", "tool": "write"}
    for reviewer, bucket, count in ((7, 0, 2), (7, 12, 3), (7, 79, 1), (7, 120, 4), (8, 12, 5)):
        old.objects.create(**key, reviewer=reviewer, bucket=bucket, count=count)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("nexo_django", "0017_insight_wait_rows")])
    new = executor.loader.project_state([("nexo_django", "0017_insight_wait_rows")]).apps.get_model(
        "nexo_django", "InsightWait")
    rows = {row.reviewer: row for row in new.objects.all()}
    assert set(rows) == {7, 8}
    assert (rows[7].count, rows[7].b0, rows[7].b12, rows[7].b79, rows[7].b1) == (10, 2, 3, 5, 0)
    assert (rows[8].count, rows[8].b12) == (5, 5)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("nexo_django", "0016_insight")])
    old = executor.loader.project_state([("nexo_django", "0016_insight")]).apps.get_model("nexo_django", "InsightWait")
    assert sorted(old.objects.values_list("reviewer", "bucket", "count")) == [(7, 0, 2), (7, 12, 3), (7, 79, 5), (8, 12, 5)]
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("nexo_django"))
