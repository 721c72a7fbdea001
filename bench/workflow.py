"""The cost of one workflow step (a checkpoint's commit) beside one agent turn, in process.

A step: ``self.checkpoint(name, fn)`` of a trivial function in a durable workflow run: the fenced
update of the run (its lease renewed) and the step's insert, one write transaction. Timed as the
difference between a run of ``--steps`` checkpoints and a run of none, per step; a replayed step
(a later pass returning the stored result) likewise. The peer, in the same process and database:
one agent turn (a scripted model turn with an ungated ``glob``, through the durable journal),
timed the same way from an agent run of ``--steps`` turns and one of none. The commit floor (one
small INSERT + COMMIT) is printed beside them.

    python -m bench.workflow --db sqlite|postgres [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, median, ms, setup_django

#: the workflow of the benchmark, importable by name (a durable run rebuilds it from its path)
STEPS_PATH = "bench.workflow.Steps"


def _steps_class() -> Any:
    from nexo_django import Workflow

    class Steps(Workflow):
        """``payload["n"]`` checkpoints of a trivial function, then (with ``ask``) a question."""

        def call(self, payload: Any) -> Any:
            for i in range(payload["n"]):
                self.checkpoint(f"s{i}", int, i)
            if payload.get("ask"):
                return self.ask("go", "Go on?")
            return payload["n"]

    Steps.__module__, Steps.__qualname__ = __name__, "Steps"
    return Steps


def _timed(fn: Any) -> int:
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model

    from bench.agents import Looker
    from bench.approval_cycle import commit_cost

    steps_cls = globals()["Steps"] = _steps_class()
    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    n = args.steps

    def workflow(count: int) -> None:
        run = steps_cls.run({"n": count})
        assert run.status == "done", run.error

    def agent(turns: int) -> None:
        run = _agent_run(Looker, turns)
        assert run.status == "done", run.error

    def replay() -> int:
        run = steps_cls.run({"n": n, "ask": True})
        assert run.status == "suspended", run.error
        return _timed(lambda: run.answer("go", True, by=user))  # one pass: n stored results, then done

    def replay_none() -> int:
        run = steps_cls.run({"n": 0, "ask": True})
        return _timed(lambda: run.answer("go", True, by=user))

    for _ in range(2):  # warm-up
        workflow(n), workflow(0), agent(n), agent(0), replay(), replay_none()
    step, turn, replayed = [], [], []
    for _ in range(args.repeat):
        step.append((_timed(lambda: workflow(n)) - _timed(lambda: workflow(0))) / n)
        turn.append((_timed(lambda: agent(n)) - _timed(lambda: agent(0))) / n)
        replayed.append((replay() - replay_none()) / n)
    figure("workflow_step", db=db_label(), steps=n, repeat=args.repeat, step_median_ms=ms(median(step)),
           replayed_step_median_ms=ms(median(replayed)), agent_turn_median_ms=ms(median(turn)),
           commit_floor_ms=commit_cost())


def _agent_run(cls: Any, turns: int) -> Any:
    from nexo_django.testing import ScriptedModel, reply, tool_call

    model = ScriptedModel([*(tool_call("glob", pattern="*") for _ in range(turns)), reply("Looked.")])
    return cls.run("Look around.", model=model)


if __name__ == "__main__":
    main()
