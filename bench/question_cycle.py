"""A person's answer to a question, and to an MCP server's (elicitation), beside an approval.

A question cycle: a workflow run asks a typed question (``self.ask`` with a flat object's schema)
→ suspended, its ``question.asked`` notice written in that commit → the answer through the one
answering function (``workflow_questions.answer``: permission, four eyes, expiry, schema,
compare-and-set), the run woken → the inline queue resumes it at commit → done. Beside it, the
approval cycle of ``bench.approval_cycle`` (a scripted agent's gated write → approve → done).
An elicitation cycle: a scripted agent calls an MCP tool (the SDK's own server over stdio,
tests/mcp_http_server.py) that answers ``input_required`` → suspended, the ask a question of the
run → answered through the same function → the next pass calls the tool again with the answer and
the ``requestState`` → done. Its server process is started on each pass (a durable run holds no
session while it waits): most of its time. Each timed end to end and split at the suspension;
medians and p95 over ``--cycles`` (the elicitation over ``--elicitations``).

    python -m bench.question_cycle --db sqlite|postgres [--cycles N] [--elicitations N]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, median, ms, p95, setup_django

SCHEMA = {"type": "object", "required": ["title", "priority"], "properties": {
    "title": {"type": "string", "maxLength": 80}, "priority": {"type": "integer", "minimum": 1, "maximum": 5}}}
WARMUP = 10


def _asking_class() -> Any:
    from nexo_django import Workflow

    class Asks(Workflow):
        def call(self, payload: Any) -> Any:
            return self.ask("ticket", "File the ticket", schema=SCHEMA)

    Asks.__module__, Asks.__qualname__ = __name__, "Asks"
    return Asks


def _eliciting_class() -> Any:
    import sys
    from pathlib import Path

    from nexo_django import Agent, Permissions
    from nexo_django.mcp import MCPServer
    from nexo_django.testing import ScriptedModel, reply, tool_call

    script = str(Path(__file__).resolve().parents[1] / "tests" / "mcp_http_server.py")

    class Elicits(Agent):
        model = ScriptedModel([tool_call("ask"), reply("done")])
        permissions = Permissions("approve", mcp_allow=["ask"])
        mcp_servers = [MCPServer.stdio("test", sys.executable, [script, "--transport", "stdio"], timeout=10)]

    Elicits.__module__, Elicits.__qualname__ = __name__, "Elicits"
    return Elicits


def elicitation_cycle(agent: Any, user: Any, split: list[int]) -> None:
    from nexo_django.durable import workflow_questions
    from nexo_django.models import WorkflowStep

    start = time.perf_counter_ns()
    run = agent.run("Ask me for a word.")
    if run.status != "suspended":
        raise RuntimeError(f"expected a suspended run, got {run.status}: {run.error}")
    split.append(time.perf_counter_ns() - start)
    step = WorkflowStep.objects.get(run_id=run.pk, status="waiting")
    workflow_questions.answer(run, step.name, {"word": "bench"}, by=user, source="bench")
    run.refresh_from_db()
    if run.status != "done":
        raise RuntimeError(f"expected a done run, got {run.status}: {run.error}")


def question_cycle(workflow: Any, user: Any, split: list[int]) -> None:
    from nexo_django.durable import workflow_questions

    start = time.perf_counter_ns()
    run = workflow.run({})
    if run.status != "suspended":
        raise RuntimeError(f"expected a suspended run, got {run.status}: {run.error}")
    split.append(time.perf_counter_ns() - start)
    workflow_questions.answer(run.agent_run, "ticket", {"title": "Fix it", "priority": 2}, by=user, source="bench")
    run.refresh_from_db()
    if run.status != "done":
        raise RuntimeError(f"expected a done run, got {run.status}: {run.error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--elicitations", type=int, default=10)
    args = parser.parse_args()
    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model

    from bench.agents import VirtualScribe
    from bench.approval_cycle import one_cycle

    workflow = globals()["Asks"] = _asking_class()
    eliciting = globals()["Elicits"] = _eliciting_class()
    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    ignored: list[int] = []
    for _ in range(WARMUP):
        question_cycle(workflow, user, ignored)
        one_cycle(VirtualScribe, None, user)
    asked: list[int] = []
    answered: list[int] = []
    approval_suspended: list[int] = []
    approved: list[int] = []
    for _ in range(args.cycles):  # interleaved: both see the same machine at the same moment
        start = time.perf_counter_ns()
        question_cycle(workflow, user, asked)
        answered.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        one_cycle(VirtualScribe, None, user, approval_suspended)
        approved.append(time.perf_counter_ns() - start)
    elicited: list[int] = []
    elicited_suspended: list[int] = []
    approved_beside: list[int] = []
    elicitation_cycle(eliciting, user, [])  # warm-up
    for _ in range(args.elicitations):
        start = time.perf_counter_ns()
        elicitation_cycle(eliciting, user, elicited_suspended)
        elicited.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        one_cycle(VirtualScribe, None, user)
        approved_beside.append(time.perf_counter_ns() - start)
    figure("elicitation_cycle", db=db_label(), cycles=args.elicitations,
           elicitation_median_ms=ms(median(elicited)), elicitation_p95_ms=ms(p95(elicited)),
           elicitation_to_suspended_ms=ms(median(elicited_suspended)),
           approval_median_ms=ms(median(approved_beside)))
    figure("question_cycle", db=db_label(), cycles=args.cycles,
           question_median_ms=ms(median(answered)), question_p95_ms=ms(p95(answered)),
           question_to_suspended_ms=ms(median(asked)),
           approval_median_ms=ms(median(approved)), approval_p95_ms=ms(p95(approved)),
           approval_to_suspended_ms=ms(median(approval_suspended)))


if __name__ == "__main__":
    main()
