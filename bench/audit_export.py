"""Benchmark: the decision log exported from the admin (CSV), streamed, at 100k decisions.

The export (``<admin>/nexo_django/decision/export/csv/``) is read to the end through Django's
test Client as a superuser; tracemalloc's peak is taken while it streams. The peer, measured in
the same process on the same rows, is the same rows materialised the way a non-streamed export
would: ``list(queryset)`` and the CSV built in one string. (Both times are taken under tracemalloc,
which slows every allocation: compare them with each other only.)

    python -m bench.audit_export --db sqlite|postgres [--rows N]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
import uuid
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, note, setup_django

BATCH = 5_000


def add_decisions(rows: int) -> None:
    from nexo_django.models import AgentRun, CallStatus, Decision, RunStatus, ToolCall, args_digest

    runs = AgentRun.objects.bulk_create(
        AgentRun(agent="app.agents.Scribe", prompt="p", status=RunStatus.DONE) for _ in range(max(rows // 100, 1))
    )
    for start in range(0, rows, BATCH):
        calls = []
        for i in range(start, min(start + BATCH, rows)):
            args = {"path": f"notes/{i}.txt", "content": "x" * 200}
            calls.append(ToolCall(run=runs[i % len(runs)], agent="app.agents.Scribe", tool_call_id=f"c{i}_{uuid.uuid4().hex[:6]}",
                                  name="write", capability="write", args=args, digest=args_digest(args),
                                  status=CallStatus.SUCCEEDED))
        created = ToolCall.objects.bulk_create(calls)
        Decision.objects.bulk_create(
            Decision(tool_call=c, verdict="approved", digest=c.digest, note="fine", source="admin") for c in created
        )


def measure(func: Any) -> tuple[float, float, Any]:
    tracemalloc.start()
    start = time.perf_counter()
    result = func()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, peak / 2**20, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model
    from django.test import Client

    from nexo_django.admin import audit
    from nexo_django.models import Decision

    start = time.perf_counter()
    add_decisions(args.rows)
    note(f"inserted {args.rows} decisions in {time.perf_counter() - start:.1f}s")
    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    client = Client()
    client.force_login(user)

    def streamed() -> int:
        response = client.get("/admin/nexo_django/decision/export/csv/")
        return sum(chunk.count(b"\n") for chunk in response.streaming_content)

    def materialised() -> int:
        rows = list(Decision.objects.select_related("tool_call", "decided_by").order_by("-decided_at", "-id"))
        return "".join(audit.csv_lines(iter(rows))).count("\n")

    s_seconds, s_peak, s_lines = measure(streamed)
    m_seconds, m_peak, m_lines = measure(materialised)
    if s_lines != args.rows + 1 or m_lines != args.rows + 1:
        raise RuntimeError(f"expected {args.rows + 1} lines, got {s_lines} streamed and {m_lines} materialised")
    figure("audit_export", db=db_label(), rows=args.rows, streamed_peak_mib=s_peak, streamed_s=s_seconds,
           materialised_peak_mib=m_peak, materialised_s=m_seconds)


if __name__ == "__main__":
    main()
