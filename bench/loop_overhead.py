"""Benchmark 2: the harness's own cost per turn, in process, with a scripted model and a no-op tool.

``Agent.prompt()`` with a model that asks for ``noop()`` M times and then answers. The model's
own time is measured inside it and subtracted, so what is left is the loop: gate, validation,
tool dispatch, journal, events. Per-turn cost is read at turn 10 and at turn 200 from the
timestamps of the ``model_request`` events, to show whether it grows with the transcript.

    python -m bench.loop_overhead [--turns M] [--runs R] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from typing import Any

from bench.common import database_url, figure, median, note, profile, setup_django

EARLY = range(6, 16)  # "turn 10": the median of turns 6..15
LATE = range(196, 206)  # "turn 200": the median of turns 196..205


class FlatScriptedModel:
    """A scripted model whose own cost does not grow with the transcript: it asks for ``noop()``
    until ``turns`` turns are played, then answers. It knows its turn from the transcript's
    length (each turn adds an assistant and a tool message), so it never scans it."""

    is_scripted = True

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.spent_ns = 0
        self.stamps: list[int] = []  # when each complete() was called

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Any:
        from nexo_django.core.llm.base import Completion

        start = time.perf_counter_ns()
        self.stamps.append(start)
        turn = (len(messages) - 1) // 2
        if turn < self.turns:
            message: dict[str, Any] = {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{turn}_0", "name": "noop", "args": {}}],
            }  # fmt: skip
        else:
            message = {"role": "assistant", "content": "Done."}
        completion = Completion(message=message, usage={"input_tokens": 1, "output_tokens": 1})
        self.spent_ns += time.perf_counter_ns() - start
        return completion


def make_agent_class() -> type:
    from nexo_django import Agent, tool

    @tool(capability="read", idempotent=True)
    def noop() -> dict[str, Any]:
        """Does nothing (the benchmark's tool)."""
        return {}

    class LoopBench(Agent):
        permissions = "auto"
        sandbox = "virtual"
        tools = [noop]
        max_turns = 100_000

    return LoopBench


def durable_run(agent_class: type, turns: int, cpu: list[int] | None = None) -> tuple[int, int, list[int]]:
    """``Agent.run()``: the same loop on the durable journal, in this process. Total ns, model ns,
    and the ns of each turn (from one model call to the next: the journal's writes included);
    ``cpu`` receives this process's CPU ns for the run."""
    model = FlatScriptedModel(turns)
    start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
    run = agent_class.run("Call noop until you are told to stop.", model=model)
    total = time.perf_counter_ns() - start
    if cpu is not None:
        cpu.append(time.process_time_ns() - start_cpu)
    if run.status != "done" or run.result != "Done.":
        raise RuntimeError(f"durable run ended {run.status}: {run.error or run.result!r}")
    stamps = model.stamps
    if len(stamps) != turns + 1:
        raise RuntimeError(f"{len(stamps)} model calls for {turns} turns")
    return total, model.spent_ns, [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def durable(agent_class: type, turns: int, runs: int) -> None:
    """The durable loop per turn, on SQLite WAL + synchronous=FULL (this process's database)."""
    from bench.common import counting, db_label

    durable_run(agent_class, turns)  # warm-up
    per_turn: list[float] = []
    early: list[float] = []
    late: list[float] = []
    cpu: list[int] = []
    for _ in range(runs):
        total, spent, steps = durable_run(agent_class, turns, cpu)
        per_turn.append((total - spent) / (turns + 1) / 1e3)
        early.append(median([steps[t - 1] for t in EARLY]) / 1e3)
        late.append(median([steps[t - 1] for t in LATE]) / 1e3)
    with counting() as counts:  # one more run, counted apart (the wrapper costs time)
        durable_run(agent_class, turns)
    e, late_median = median(early), median(late)
    figure(
        "durable_loop", db=db_label(), turns=turns, runs=runs, us_per_turn=median(per_turn),
        cpu_us_per_turn=median(cpu) / (turns + 1) / 1e3,
        turn10_us=e, turn200_us=late_median, growth=late_median / e,
        queries_per_turn=counts.queries / (turns + 1), write_transactions_per_turn=counts.write_transactions / (turns + 1),
    )  # fmt: skip


def timed_run(agent_class: type, model: Any, turns: int) -> tuple[int, int, list[int]]:
    """Total ns, model ns, and the ns of each turn (model_request to model_request)."""
    stamps: list[int] = []

    def on_event(type: str, data: dict[str, Any]) -> None:
        if type == "model_request":
            stamps.append(time.perf_counter_ns())

    agent = agent_class(model=model, on_event=on_event)
    start = time.perf_counter_ns()
    reply = agent.prompt("Call noop until you are told to stop.")
    total = time.perf_counter_ns() - start
    if reply.content != "Done." or len(reply.tool_calls) != turns:
        raise RuntimeError(f"unexpected reply: {reply.content!r}, {len(reply.tool_calls)} calls")
    return total, getattr(model, "spent_ns", 0), [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def model_cost(model: Any, turns: int) -> tuple[float, float]:
    """µs one ``complete()`` call takes at turn 10 and at turn 200 (the model alone)."""
    results = []
    for turn in (10, 200):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for i in range(turn):
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [{"id": f"call_{i}_0", "name": "noop", "args": {}}]})  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": f"call_{i}_0", "name": "noop", "content": {}})
        samples = []
        for _ in range(20):
            if hasattr(model, "requests"):
                model.requests.clear()
            start = time.perf_counter_ns()
            model.complete(messages, [])
            samples.append(time.perf_counter_ns() - start)
        results.append(median(samples) / 1e3)
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=210)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--durable-runs", type=int, default=5, help="durable runs of M turns (0: none)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    turns = args.turns
    if turns <= LATE.stop:
        raise SystemExit(f"--turns must exceed {LATE.stop} to read turn 200")

    # prompt() needs no database (Django is set up because conf.py reads settings.NEXO); the
    # durable loop runs on this SQLite file in WAL with synchronous=FULL.
    setup_django(database_url("sqlite-wal-full"))
    from nexo_django.testing import ScriptedModel, tool_call
    from nexo_django.testing import reply as final

    agent_class = make_agent_class()
    if args.profile:
        print(profile(lambda: [timed_run(agent_class, FlatScriptedModel(turns), turns) for _ in range(5)], top=40,
                      sort="tottime"))  # fmt: skip
        return

    timed_run(agent_class, FlatScriptedModel(turns), turns)  # warm-up
    per_turn: list[float] = []
    early: list[float] = []
    late: list[float] = []
    model_ns: list[float] = []
    for _ in range(args.runs):
        model = FlatScriptedModel(turns)
        total, spent, steps = timed_run(agent_class, model, turns)
        per_turn.append((total - spent) / (turns + 1) / 1e3)
        model_ns.append(spent / (turns + 1) / 1e3)
        # steps[k] is turn k+1 → turn k+2: a model turn plus its tool call, harness included.
        early.append(median([steps[t - 1] for t in EARLY]) / 1e3)
        late.append(median([steps[t - 1] for t in LATE]) / 1e3)

    # Memory: what a run of M turns allocates at its peak and keeps (the reply holds the transcript).
    memory: dict[int, tuple[int, int]] = {}
    for m in (10, turns):
        gc.collect()
        tracemalloc.start()
        agent = agent_class(model=FlatScriptedModel(m))
        kept = agent.prompt("go")
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del kept, agent
        memory[m] = (current, peak)
    per_turn_bytes = (memory[turns][1] - memory[10][1]) / (turns - 10)

    e, late_median = median(early), median(late)
    figure(
        "loop_overhead", model="flat_scripted", turns=turns, runs=args.runs,
        us_per_turn=median(per_turn), model_us_per_turn=median(model_ns),
        turn10_us=e, turn200_us=late_median, growth=late_median / e,
    )  # fmt: skip
    figure(
        "loop_memory", turns=turns, peak_kib_10_turns=memory[10][1] / 1024,
        peak_kib=memory[turns][1] / 1024, kept_kib=memory[turns][0] / 1024, bytes_per_turn=round(per_turn_bytes),
    )  # fmt: skip

    # The same loop with the test suite's ScriptedModel, whose complete() deep-copies the whole
    # transcript into .requests: its cost grows with the run (the model's, not the harness's).
    script = [tool_call("noop") for _ in range(turns)] + [final("Done.")]
    scripted_early: list[float] = []
    scripted_late: list[float] = []
    for _ in range(max(3, args.runs // 6)):
        _, _, steps = timed_run(agent_class, ScriptedModel(script), turns)
        scripted_early.append(median([steps[t - 1] for t in EARLY]) / 1e3)
        scripted_late.append(median([steps[t - 1] for t in LATE]) / 1e3)
    model10, model200 = model_cost(ScriptedModel(script), turns)
    figure(
        "loop_overhead", model="testing.ScriptedModel", turns=turns,
        turn10_us=median(scripted_early), turn200_us=median(scripted_late),
        model_turn10_us=model10, model_turn200_us=model200,
    )  # fmt: skip
    if args.durable_runs:
        durable(agent_class, turns, args.durable_runs)
    note("turnN_us is one whole turn (model + tool + harness); us_per_turn subtracts the model")


if __name__ == "__main__":
    main()
