"""The run's live page tells the truth, in headless Chromium under a real ASGI server (issue 33,
item 4): its status badge follows the run through every change, driven by the event stream
(queued, running while the answer streams, suspended while a call waits, running again, done;
and cancelled, and failed), and a page reloaded mid-answer starts with the text so far. A real
rqworker runs the runs and a real Redis keeps their text; scripted, streamed models
(tests/live_agents.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from nexo_django.models import AgentRun, RunStatus
from tests.browsing import log_in_with_session
from tests.durable_agents import model_gate
from tests.live_agents import ENDING, STORY, Narrator, Rambler, Stumbler, open_turn

pytestmark = [pytest.mark.browser, pytest.mark.durable, pytest.mark.django_db(transaction=True)]

WAIT = 30.0


def _look(browser: Any) -> tuple[str | None, str | None, str]:
    """The badge's status and label and the live text, in one script (the page may be reloading)."""
    seen = browser.execute_script(
        "var b = document.getElementById('run-status'), t = document.getElementById('live-text');"
        "return b ? [b.getAttribute('data-status'), b.textContent, t ? t.textContent : ''] : [null, null, ''];"
    )
    return seen[0], seen[1], seen[2]


class Badge:
    """Looks at the page every 20 ms, keeping each status the badge showed, in order."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.statuses: list[str] = []

    def until(self, ready: Any, what: str) -> tuple[str, str, str]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            status, label, text = _look(self.browser)
            if status is not None:
                if not self.statuses or self.statuses[-1] != status:
                    self.statuses.append(status)
                if ready(status, text):
                    return status, label or "", text
            time.sleep(0.02)
        raise AssertionError(f"waited for {what}; the badge showed {self.statuses}")


def test_the_badge_follows_the_run_and_a_reload_mid_answer_starts_with_the_text_so_far_scripted(
    rq_worker: Any, asgi_server: Any, browser: Any, django_user_model: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    ann = django_user_model.objects.create_user("ann", is_staff=True)
    ann.user_permissions.add(Permission.objects.get(codename="decide_toolcall"))
    url = asgi_server.url
    log_in_with_session(browser, url, ann, "/runs/")

    run = Narrator.run_later("Tell me a story.", user=ann)
    browser.get(f"{url}/runs/{run.pk}/")
    badge = Badge(browser)
    badge.until(lambda s, t: s == "queued", "queued")
    gate = model_gate(tmp_path, monkeypatch)  # each turn holds its text after HELD_AFTER pieces
    rq_worker(worker_class="rq.worker.SimpleWorker")

    # Running while the answer streams (the claim is an event; the stream sends the status).
    status, label, before = badge.until(lambda s, t: len(t.split()) >= 5, "the answer streaming")
    assert (status, label) == ("running", "Running") and STORY.startswith(before)
    # Reloaded mid-answer: the new page's first text is the text so far, from the first word.
    browser.refresh()
    status, _, text = badge.until(lambda s, t: bool(t), "text after the reload")
    assert status == "running"
    assert text.startswith(before) and STORY.startswith(text), (before, text)
    first_turn = open_turn(gate, 0)

    # Suspended while the write waits for a person.
    badge.until(lambda s, t: s == "suspended", "suspended")
    AgentRun.objects.get(pk=run.pk).pending_calls().get().approve(by=ann)
    # Running again while the ending streams, then done.
    status, _, text = badge.until(lambda s, t: s == "running" and bool(t), "the ending streaming")
    assert ENDING.startswith(text), text
    open_turn(gate, 1)
    badge.until(lambda s, t: s == "done", "done")
    # (Queued for a moment between the decision and the worker's claim, if the page looked then.)
    assert badge.statuses in (["queued", "running", "suspended", "running", "done"],
                              ["queued", "running", "suspended", "queued", "running", "done"]), badge.statuses

    # Cancelled while it talks (held mid-turn: its first turn's gate is closed again).
    first_turn.unlink()
    talking = Rambler.run_later("Talk.", user=ann)
    browser.get(f"{url}/runs/{talking.pk}/")
    badge = Badge(browser)
    badge.until(lambda s, t: s == "running" and bool(t), "talking")
    assert talking.cancel(by=ann, reason="enough")
    _, label, _ = badge.until(lambda s, t: s == "cancelled", "cancelled")
    assert label == "Cancelled"
    open_turn(gate, 0)  # the held model's thread ends, and the worker takes the next run

    # Failed mid-answer.
    failing = Stumbler.run_later("Talk.", user=ann)
    browser.get(f"{url}/runs/{failing.pk}/")
    badge = Badge(browser)
    badge.until(lambda s, t: s == "failed", "failed")
    assert "running" in badge.statuses or badge.statuses == ["failed"]
    assert AgentRun.objects.get(pk=failing.pk).status == RunStatus.FAILED
