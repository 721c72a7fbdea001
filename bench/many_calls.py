"""Benchmark: a run's pages at 10,000 calls in one turn (issue 33, item 2).

Target: the run's admin page, the user's run page and the status JSON that page polls, each
under 1 s and 1 MB, whatever the number of calls. The run is one suspended turn of ``--calls``
calls (``write`` and ``shell`` in turn): the first half ran (each with its result message in the
transcript), the second half waits for a person; one event per call. Its rows are inserted in
bulk (``bulk_create``), not through the loop: what is measured is the pages. Each page is
rendered with Django's test Client as a logged-in superuser, after one warm-up render; the
figures are the median and slowest of ``--renders`` renders, the body's bytes and the queries of
one render. Beside them, in the same run, the same pages at ``--peer-calls`` (10) calls: the
floor a page costs whatever its calls.

    python -m bench.many_calls [--db sqlite|postgres] [--calls 10000] [--renders 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, note, setup_django

TOOLS = (("write", "write"), ("shell", "shell"))


def make_run_with_calls(calls: int, *, agent: str, user: Any = None) -> Any:
    """A suspended run of one turn of ``calls`` calls, inserted in bulk: the first half succeeded
    (each with its result message), the rest wait for a decision; one ``tool_call`` event each."""
    from nexo_django.models import (
        AgentRun,
        CallStatus,
        RunEvent,
        RunMessage,
        RunStatus,
        ToolCall,
        args_digest,
    )

    run = AgentRun.objects.create(agent=agent, prompt="Tidy the notes.", status=RunStatus.SUSPENDED, created_by=user)
    done = calls // 2
    specs = []
    for i in range(calls):
        name, capability = TOOLS[i % len(TOOLS)]
        args = {"path": f"notes/{i}.txt", "content": f"note {i}\n"} if name == "write" else {"command": f"echo {i}"}
        specs.append((f"call_{i}", name, capability, args))
    ToolCall.objects.bulk_create(
        [ToolCall(run=run, agent=agent, tool_call_id=cid, name=name, capability=capability, args=args,
                  digest=args_digest(args), idempotent=False,
                  status=CallStatus.SUCCEEDED if i < done else CallStatus.PENDING_APPROVAL,
                  result={"ok": True, "n": i} if i < done else None)
         for i, (cid, name, capability, args) in enumerate(specs)],
        batch_size=2_000,
    )
    messages = [
        RunMessage(run=run, seq=0, role="user", data={"role": "user", "content": "Tidy the notes."}),
        RunMessage(run=run, seq=1, role="assistant", data={
            "role": "assistant", "content": None,
            "tool_calls": [{"id": cid, "name": name, "args": args} for cid, name, _, args in specs]}),
    ]
    messages += [
        RunMessage(run=run, seq=2 + i, role="tool",
                   data={"role": "tool", "tool_call_id": specs[i][0], "name": specs[i][1], "content": {"ok": True, "n": i}})
        for i in range(done)
    ]
    RunMessage.objects.bulk_create(messages, batch_size=2_000)
    RunEvent.objects.bulk_create(
        [RunEvent(run=run, type="tool_call", data={"id": cid, "name": name}) for cid, name, _, _ in specs],
        batch_size=2_000,
    )
    return run


def pages(run: Any) -> dict[str, str]:
    from django.urls import reverse

    return {
        "admin_run": reverse("admin:nexo_django_agentrun_change", args=[run.pk]),
        "user_run": reverse("nexo_django:run_detail", args=[run.pk]),
        "status_json": reverse("nexo_django:run_status", args=[run.pk]),
    }


def measure(client: Any, url: str, renders: int) -> tuple[float, float, int, int]:
    """Median and slowest ms of ``renders`` GETs after a warm-up, the body's bytes, the queries."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"GET {url}: {response.status_code}")
    times = []
    for _ in range(renders):
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    return statistics.median(times), max(times), len(response.content), len(captured.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--peer-calls", type=int, default=10)
    parser.add_argument("--renders", type=int, default=5)
    args = parser.parse_args()

    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    client = Client()
    client.force_login(user)
    for calls in (args.peer_calls, args.calls):
        start = time.perf_counter()
        run = make_run_with_calls(calls, agent="bench.agents.VirtualScribe", user=user)
        note(f"{calls} calls: inserted in {time.perf_counter() - start:.1f}s")
        for page, url in pages(run).items():
            median_ms, slowest_ms, size, queries = measure(client, url, args.renders)
            figure("many_calls_page", page=page, db=db_label(), calls=calls, median_ms=median_ms,
                   slowest_ms=slowest_ms, bytes=size, queries=queries)


if __name__ == "__main__":
    main()
