"""Benchmark: the approvals dashboard at 1,000,000 decisions and 100,000 pending calls (issue 50).

Targets: every page of the dashboard (its default 30 days, a year, one agent, the suggested rules,
one suggestion's evidence, a chart's CSV) under 200 ms on PostgreSQL and 500 ms on SQLite,
whatever the size of the history. The history is ``--decisions`` decided calls and ``--pending``
waiting ones, ten per run, over the last year (five agents; write, read, shell and a tool without
a target; forty folders; six reviewers; a tenth denied, a twentieth expired, a tenth by a rule),
bulk-inserted (executemany on SQLite, COPY on PostgreSQL: bench.inbox's Inserter); the tallies
the deciding commit would have written are computed from the same rows in Python and written with
``tally.write``. Beside the pages, in the same run and at the same data, the peers: Django's own
admin changelists of the decisions (the audit log) and of the pending calls (the inbox). The
figures: median ms of ``--renders`` renders after two warm-ups, and the queries of one.

    python -m bench.insight --db sqlite|postgres [--decisions 1000000] [--pending 100000] [--renders 5]
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from bench.common import DATABASES, database_url, db_label, figure, note, setup_django

AGENTS = [f"app.agents.{name}" for name in ("Scribe", "Researcher", "Janitor", "Mailer", "Deployer")]
TOOLS = [("write", "write"), ("read", "read"), ("shell", "shell"), ("deploy", "deploy")]
FOLDERS = [f"{top}/{sub}" for top in ("docs", "notes", "src", "reports", "tmp") for sub in "abcdefgh"]
COMMANDS = ["make test", "make lint", "git status", "ls -la", "pytest -q", "rm -rf build", "du -sh .", "uptime"]
CALLS_PER_RUN = 10


def args_for(rng: random.Random, name: str) -> dict[str, Any]:
    if name in ("write", "read"):
        return {"path": f"{rng.choice(FOLDERS)}/{rng.randrange(50)}.md"}
    if name == "shell":
        return {"command": rng.choice(COMMANDS)}
    return {"target": "staging"}


def build(ins: Any, decisions: int, pending: int, reviewers: list[int]) -> None:
    """The runs, calls and decisions, and the tallies they would have written."""
    from django.db import transaction
    from django.utils import timezone

    from nexo_django.durable.insight import tally
    from nexo_django.models import AgentRun, Decision, ToolCall, args_digest

    rng = random.Random(50)
    now = timezone.now()
    total = decisions + pending
    prepared: dict[str, tuple[Any, str, tuple[str, str, str]]] = {}
    merged = tally.Merged()
    with transaction.atomic():
        if ins.pg:
            with ins.connection.cursor() as cursor:
                cursor.execute("SET LOCAL session_replication_role = replica")
        runs, calls, rows = [], [], []
        for r in range((total + CALLS_PER_RUN - 1) // CALLS_PER_RUN):
            agent = AGENTS[r % len(AGENTS)]
            started = now - timedelta(seconds=rng.uniform(0, 365 * 86400)) if r * CALLS_PER_RUN < decisions else \
                now - timedelta(seconds=rng.uniform(0, 10 * 86400))
            run_id = uuid.uuid5(uuid.NAMESPACE_OID, f"insight-run-{r}")
            status = "done" if r * CALLS_PER_RUN < decisions else "suspended"
            runs.append((ins.value(run_id), agent, "p", ins.value(status), ins.value(started), ins.value(started), 1))
            for c in range(CALLS_PER_RUN):
                n = r * CALLS_PER_RUN + c
                if n >= total:
                    break
                name, capability = TOOLS[rng.randrange(len(TOOLS))]
                args = args_for(rng, name)
                key = repr(sorted(args.items()))
                if key not in prepared:
                    prepared[key] = (ins.value(args), args_digest(args), tally.target_of(capability, args))
                stored, digest, target = prepared[key]
                created = started + timedelta(seconds=c)
                if n < decisions:
                    roll = rng.random()
                    outcome, source = ("expired", "expiry") if roll < 0.05 else ("denied", "admin") if roll < 0.15 \
                        else ("approved", "rule") if roll < 0.25 else ("approved", "admin")
                    wait = 0.0 if source == "rule" else 86400.0 if source == "expiry" else rng.lognormvariate(7, 1.5)
                    reviewer = rng.choice(reviewers) if source == "admin" else 0
                    decided = created + timedelta(seconds=wait)
                    status_call = "expired" if outcome == "expired" else outcome
                    verdict = "approved" if outcome == "approved" else "denied"
                    rows.append((n + 1, verdict, digest, reviewer or None, ins.value(decided), source))
                    # What the deciding commit writes (tally.record), added up here.
                    call = ToolCall(agent=agent, name=name, capability=capability, created_at=created)
                    merged.add(tally.rows_of(call, verdict=verdict, source=source, reviewer=reviewer, rule=None,
                                             at=decided, target=target))
                else:
                    status_call = "pending_approval"
                calls.append((ins.value(run_id), agent, f"call_{c}", name, capability, stored, digest,
                              status_call, ins.value(False), ins.value(created), ins.value(created)))
        ins.insert(AgentRun, ["id", "agent", "prompt", "status", "created_at", "updated_at", "generation"], runs)
        ins.insert(ToolCall, ["run_id", "agent", "tool_call_id", "name", "capability", "args", "digest", "status",
                              "idempotent", "created_at", "updated_at"], calls)
        ins.insert(Decision, ["tool_call_id", "verdict", "digest", "decided_by_id", "decided_at", "source"], rows)
        written = merged.result()
        tally.write(written)
    if ins.pg:
        with ins.connection.cursor() as cursor:
            cursor.execute("VACUUM (ANALYZE)")
    else:
        with ins.connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    note(", ".join(f"{len(found)} {table.model.__name__} rows" for table, found in written.items())
         + f" for {decisions} decisions")


def body(response: Any) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def render(client: Any, url: str, renders: int, expect: str) -> tuple[float, int]:
    """Median ms over ``renders`` GETs (after two warm-ups, the body read) and the queries of one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.common import median, ms

    for _ in range(2):
        response = client.get(url)
        if response.status_code != 200 or expect.encode() not in body(response):
            raise RuntimeError(f"GET {url}: {response.status_code}, expected {expect!r} in the page")
    times = []
    for _ in range(renders):
        start = time.perf_counter_ns()
        body(client.get(url))
        times.append(time.perf_counter_ns() - start)
    with CaptureQueriesContext(connection) as captured:
        body(client.get(url))
    if SLOWEST:
        for query in sorted(captured.captured_queries, key=lambda q: -float(q["time"]))[:SLOWEST]:
            note(f"  {float(query['time']) * 1000:7.1f} ms  {query['sql'][:300]}")
    return ms(median(times)), len(captured.captured_queries)


#: ``--slowest N``: the N slowest queries of each page, noted after its figure's render
SLOWEST = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--decisions", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--renders", type=int, default=5)
    parser.add_argument("--slowest", type=int, default=0, help="note each page's N slowest queries")
    args = parser.parse_args()
    global SLOWEST
    SLOWEST = args.slowest

    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from bench.inbox import Inserter
    from nexo_django.durable.insight import suggest
    from nexo_django.models import Decision, ToolCall

    user_model = get_user_model()
    user = user_model.objects.create_superuser("bench", "bench@example.invalid", "bench")
    reviewers = [user_model.objects.create_user(f"reviewer{i}", is_staff=True).pk for i in range(6)]
    client = Client()
    client.force_login(user)
    start = time.perf_counter()
    build(Inserter(), args.decisions, args.pending, reviewers)
    built = time.perf_counter() - start
    found = (Decision.objects.count(), ToolCall.objects.filter(status="pending_approval").count())
    if found != (args.decisions, args.pending):
        raise RuntimeError(f"expected {args.decisions} decisions and {args.pending} pending calls, found {found}")
    figure("insight_build", db=db_label(), decisions=args.decisions, pending=args.pending, seconds=built)
    dashboard = reverse("admin:nexo_django_insight")
    first = suggest.suggestions()
    pages = {
        "dashboard": (dashboard, "Decisions over time"),
        "dashboard_year": (dashboard + "?period=365d", "Decisions over time"),
        "dashboard_agent": (dashboard + "?" + urlencode({"agent": AGENTS[0], "tool": "write"}), "Decisions over time"),
        "csv_waits": (reverse("admin:nexo_django_insight_csv", args=["wait_reviewer"]) + "?period=all", "median"),
        "suggestions": (reverse("admin:nexo_django_insight_suggestions"), "Suggested rules"),
    }
    if first:
        pages["evidence"] = (reverse("admin:nexo_django_insight_evidence") + "?" + urlencode(
            {"agent": first[0].agent, "tool": first[0].tool, "path": first[0].path}), "among the last")
    # The peers: Django's admin changelists at the same data.
    pages["peer_decisions_changelist"] = (reverse("admin:nexo_django_decision_changelist"), "decisions")
    pages["peer_inbox_changelist"] = (reverse("admin:nexo_django_pendingapproval_changelist"), "waiting")
    for page, (url, expect) in pages.items():
        median_ms, queries = render(client, url, args.renders, expect)
        figure("insight_page", page=page, db=db_label(), decisions=args.decisions, pending=args.pending,
               median_ms=median_ms, queries=queries)


if __name__ == "__main__":
    main()
