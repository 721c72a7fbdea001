"""The write cost of a durable step does not grow with the run (scripted models)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nexo_django.durable import rules
from nexo_django.models import AgentRun
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.durable_agents import Bumper, ThreeTurns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


@pytest.fixture(autouse=True)
def no_rule_stays_known(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The gate keeps "no rule names this tool" for ``rules.NEGATIVE_SECONDS`` (5 s), then asks
    the database again: a count spanning that moment (a loaded machine) saw one SELECT more (20
    statements against 19, once in CI). Here the answer holds for the whole test."""
    rules.forget()
    monkeypatch.setattr(rules, "NEGATIVE_SECONDS", 3600.0)
    yield
    rules.forget()  # what this test learnt is not kept past it


class LongBumper(Bumper):
    max_turns = 100


def queries_for_turns(turns: int, tool: str) -> int:
    if tool == "bump":
        script = [tool_call("bump", label=str(i)) for i in range(turns)] + [reply("ok")]
    else:
        script = [tool_call("glob", pattern="*") for _ in range(turns)] + [reply("ok")]
    with CaptureQueriesContext(connection) as ctx:
        run = LongBumper.run("go", permissions="auto", model=ScriptedModel(script))
    assert run.status == "done", run.error
    return len(ctx.captured_queries)


@pytest.mark.parametrize("tool", ["bump", "glob"])
def test_scripted_queries_per_turn_are_flat(tool: str) -> None:
    short = queries_for_turns(5, tool)
    long = queries_for_turns(25, tool)
    per_turn = (long - short) / 20
    # The same number of queries for every extra turn, and the same again for the next 20.
    assert queries_for_turns(45, tool) - long == long - short
    assert per_turn <= (15 if tool == "bump" else 6)


def test_scripted_three_turn_run_query_budget() -> None:
    """A three-turn approve run: start+suspend, then approve+resume+finish."""
    with CaptureQueriesContext(connection) as start:
        run = ThreeTurns.run("three")
    with CaptureQueriesContext(connection) as resume:
        run.resume(approved=True)
    run.refresh_from_db()
    assert run.status == "done"
    # Measured on SQLite: 12 and 34 (18 and 35 before run() stored the run with its first
    # commit and a resumed run was claimed with its first write).
    assert len(start.captured_queries) <= 12
    assert len(resume.captured_queries) <= 34


def test_scripted_virtual_files_are_written_when_they_change_only() -> None:
    """A virtual sandbox's tree goes with the result of the write that changed it; the closing
    commit does not write it again (it would cost the whole tree at every end of a drive)."""
    column = connection.ops.quote_name(AgentRun._meta.get_field("workspace").column)
    run = ThreeTurns.run("three")  # glob ran, the write waits for approval: nothing changed
    with CaptureQueriesContext(connection) as resume:
        run.resume(approved=True)
    writes = [q["sql"] for q in resume.captured_queries if f"{column} = " in q["sql"]]
    assert len(writes) == 1, writes
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.workspace["files"] == {"out.txt": "three"}


def test_scripted_approval_cycle_costs_five_write_transactions() -> None:
    """start to suspended one; decision and wake one; claim and executing mark one; the result
    one; the final answer and done one (counted as bench/approval_cycle.py counts them)."""
    from bench.agents import VirtualScribe
    from bench.common import counting

    with counting() as start:
        run = VirtualScribe.run("Write 'hi' to notes.txt")
    assert run.status == "suspended"
    with counting() as cycle:
        run.pending_calls().get().approve()
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert start.write_transactions == 1
    assert cycle.write_transactions == 4


def test_scripted_run_later_to_suspended_waits_for_the_disk_twice() -> None:
    """The request's commit and the worker's reply wait for the disk; the worker's claim before
    it asks the model commits without waiting (nexo_django.durable.sql.Batch(durable=False)). The whole
    cycle waits six times: run()'s five and the request's."""
    from bench.agents import VirtualScribe
    from bench.common import counting

    with counting() as start:
        run = VirtualScribe.run_later("Write 'hi' to notes.txt")  # the inline queue runs the job at commit
    run.refresh_from_db()
    assert run.status == "suspended"
    with counting() as cycle:
        run.pending_calls().get().approve()
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert (start.write_transactions, start.durable_write_transactions) == (3, 2)
    assert (cycle.write_transactions, cycle.durable_write_transactions) == (4, 4)


def test_scripted_approval_cycle_runs_prepared_statements_only() -> None:
    """Every statement of start, decision and resume is one nexo_django.durable.sql built once (the ORM
    builds none of them); run with no receivers on the models, as by default."""
    from bench.agents import VirtualScribe
    from nexo_django.durable import sql

    VirtualScribe.run("Write 'hi' to notes.txt").pending_calls().get().approve()  # builds them
    with CaptureQueriesContext(connection) as start:
        run = VirtualScribe.run("Write 'hi' to notes.txt")
    call = run.pending_calls().get()
    with CaptureQueriesContext(connection) as cycle:
        call.approve()
    prepared = {statement for statement, _ in sql._statements.values()}
    ran = [q["sql"] for q in start.captured_queries + cycle.captured_queries]
    work = [s for s in ran if s.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]
    # start: the run, its messages, events and pending call (the run object is kept current, not
    # read back); decision: the call, the decision, its event, the wake-up (which returns the new
    # generation: UPDATE ... RETURNING);
    # resume: the run with its messages, and the calls, read, then three transactions of three
    # statements each. On PostgreSQL each of those transactions is one statement
    # (nexo_django.durable.sql.Batch), and the decision is one.
    heads = [" ".join(s.split()[:4])[:80] for s in work]  # what ran, shown if the count is off
    if connection.vendor == "postgresql":
        assert len(work) == 1 + 1 + 2 + 3, heads
    else:
        # the decision's three more: the dashboard's upserts of its day's and month's rows, one
        # statement a table (durable.insight.tally: decisions, targets, waits)
        assert len(work) == 4 + 7 + 2 + 9, heads
    unprepared = [s for s in work if not any(_same(s, p) for p in prepared)]
    assert unprepared == []


def _same(executed: str, prepared: str) -> bool:
    """CaptureQueriesContext records the statement with its parameters filled in: ``executed`` is
    ``prepared`` with each ``%s`` replaced by some text. Matched piece by piece, each literal part
    at its leftmost place (enough for a pattern whose only wildcards are ``%s``): a regular
    expression of a statement with hundreds of ``%s`` backtracked for a minute against the many
    statements a whole suite's run has prepared."""
    if "%s" not in prepared:
        return executed == prepared
    first, *middle, last = prepared.split("%s")
    if not executed.startswith(first) or len(executed) < len(first) + len(last) or not executed.endswith(last):
        return False
    at, end = len(first), len(executed) - len(last)
    for part in middle:
        found = executed.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True
