"""The run's event stream tells the truth (issue 33, item 4): ``event: status`` at the start and at
every change of the run's status, the claim (queued to running) included; and a stream opened
mid-turn starts with the model's text so far, then goes on with the rest, each piece once. A real
rqworker runs the runs, a real Redis keeps the text, a real ASGI server (uvicorn) serves the
stream; a scripted, streamed model (tests/live_agents.py). The browser's side, with cancelled
and failed runs: tests/test_browser_live_page.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nexo_django.models import RunEvent, RunStatus
from tests.browsing import session_cookie
from tests.durable_agents import model_gate
from tests.event_stream import WAIT, Stream
from tests.live_agents import STORY, Rambler, open_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_a_stream_opened_mid_turn_starts_with_the_text_so_far_and_follows_the_status_scripted(
    rq_worker: Any, asgi_server: Any, django_user_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = django_user_model.objects.create_user("ann")
    cookie = session_cookie(ann)
    gate = model_gate(tmp_path, monkeypatch)  # the model holds its text after HELD_AFTER pieces
    run = Rambler.run_later("Talk.", user=ann)  # queued: no worker yet
    url = f"{asgi_server.url}/runs/{run.pk}/stream/"
    first = Stream(url, cookie)
    first.start()
    first.wait_for(lambda: first.statuses == ["queued"])

    rq_worker(worker_class="rq.worker.SimpleWorker")
    first.wait_for(lambda: len(first.deltas) >= 5)  # some words written
    # What the first page has seen was kept before it was sent: the text so far holds it.
    seen = "".join(text for _, text in list(first.deltas))
    late = Stream(url, cookie)  # a page opened (or reloaded) now
    late.start()
    late.wait_for(lambda: bool(late.so_far))
    open_turn(gate, 0)  # the rest of the turn
    late.join(WAIT)
    first.join(WAIT)
    assert first.ended and late.ended, (first.error, late.error)

    said = STORY * 2
    # The late page starts with the whole text so far (at least what the first had seen when it
    # opened), then gets the rest: each word once, none missing.
    assert late.so_far[0].startswith(seen) and said.startswith(late.so_far[0])
    assert "".join(text for _, text in late.deltas) == said
    assert "".join(text for _, text in first.deltas) == said
    # The first saw every status: the claim is an event, and the stream sends the status it reads.
    assert first.statuses == ["queued", "running", "done"]
    assert late.statuses == ["running", "done"]
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    types = list(RunEvent.objects.filter(run=run).order_by("id").values_list("type", flat=True))
    assert types[:3] == ["created", "running", "model_request"]
