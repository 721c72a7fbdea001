"""Benchmark: one call's pages at the size a model can produce (issue 21, item 6).

Target (SECURITY.md, approvals 7): any single call's decision page under 1 MB and 300 ms,
whatever the arguments' size. Three pending ``write`` calls: a 3 MB argument, a 50 MB argument and
300 kB of zero-width characters, each in its own suspended run (virtual workspace, so the diff is
a new file). Rendered with Django's test Client as a logged-in superuser, after one warm-up render:
the decision page (the figure with the target), the editor page and the run's page; bytes are the
response body.

Peers, measured in the same run on the same calls:
- ``download``: the full-arguments view (a JSON download: one dump of the arguments, the least any
  page that shows all of them must do);
- ``seed``: what the seed's decision page did with the arguments before this change (display's
  unbounded ``reveal_json`` of the arguments, the editor's ``json_for_editor``, and the transcript
  message of the call through the unbounded ``message_view``) - only these pieces, so it is a
  floor of the old page. At 50 MB it is skipped unless ``--seed-all`` (it takes minutes).

    python -m bench.decision_page [--db sqlite|postgres] [--renders N] [--seed-all]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import DATABASES, database_url, db_label, figure, note, setup_django

CASES: dict[str, Callable[[], str]] = {
    "3MB": lambda: "line of a long file, as a model writes it\n" * 71_500,
    "50MB": lambda: "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n" * 770_000,
    "300kB-zero-width": lambda: "\u200b" * 100_000,
}


def timed(func: Callable[[], Any], renders: int) -> tuple[float, float, Any]:
    """Median and slowest milliseconds of ``renders`` calls after one warm-up, and the last result."""
    result = func()
    times: list[float] = []
    for _ in range(renders):
        start = time.perf_counter()
        result = func()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", choices=DATABASES, default="sqlite")
    parser.add_argument("--renders", type=int, default=5)
    parser.add_argument("--seed-all", action="store_true", help="also measure the seed's rendering at 50 MB")
    args = parser.parse_args()

    setup_django(database_url(args.db))
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.agents import VirtualScribe
    from nexo_django.display import json_for_editor, message_view, reveal_json
    from nexo_django.models import RunMessage
    from nexo_django.testing import ScriptedModel, reply, tool_call

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
    client = Client()
    client.force_login(user)

    for case, make in CASES.items():
        content = make()
        start = time.perf_counter()
        model = ScriptedModel([tool_call("write", path="big.txt", content=content), reply("ok")])
        run = VirtualScribe.run("write it", model=model)
        call = run.pending_calls().get()
        note(f"{case}: {len(content.encode()):,} bytes of content; run stored in {time.perf_counter() - start:.1f}s")
        base = f"/admin/nexo_django/pendingapproval/{call.pk}"
        pages = {
            "decision": f"{base}/change/",
            "edit": f"{base}/edit/",
            "run": f"/admin/nexo_django/agentrun/{run.pk}/change/",
        }
        for page, url in pages.items():
            median_ms, max_ms, response = timed(lambda url=url: client.get(url), args.renders)
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
            figure(f"{page}_page", db=db_label(), case=case, bytes=len(response.content), median_ms=median_ms,
                   max_ms=max_ms, under_1MB=len(response.content) < 1_000_000, under_300ms=max_ms < 300)
        median_ms, max_ms, response = timed(lambda url=f"{base}/arguments/": client.get(url), args.renders)
        figure("peer_download", db=db_label(), case=case, bytes=len(response.content), median_ms=median_ms,
               max_ms=max_ms)
        if case == "50MB" and not args.seed_all:
            note("seed rendering at 50 MB skipped (--seed-all measures it; the issue measured 85 s, 202 MB)")
            continue
        message = RunMessage.objects.filter(run=run, role="assistant").order_by("-seq").first()
        assert message is not None

        def seed(data: Any = message.data, stored: Any = call.args) -> int:
            view = message_view(data)
            pieces = [str(reveal_json(stored)), json_for_editor(stored), *(str(c["args"]) for c in view["calls"])]
            return sum(len(p.encode()) for p in pieces)

        median_ms, max_ms, size = timed(seed, 1)
        figure("peer_seed_arguments", db=db_label(), case=case, bytes=size, median_ms=median_ms, max_ms=max_ms)


if __name__ == "__main__":
    main()
