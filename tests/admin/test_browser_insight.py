"""The approvals dashboard, the suggested rules and a run's timeline in headless Chromium under
``Content-Security-Policy: default-src 'self'`` (scripted agents): the charts' values are read
from the drawn page, and the static stylesheet is applied (the bars have its colours).

Saves insight-dashboard.png, insight-suggestions.png and insight-run-timeline.png to
tests/artifacts/ (and docs/img/ with NEXO_UPDATE_SCREENSHOTS=1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from selenium import webdriver

from nexo_django.durable import runs
from tests.admin.support import make_user, run_url
from tests.admin.test_browser_admin import save
from tests.admin.test_insight_dashboard import ALPHA, DASHBOARD, build_history, pending_call
from tests.browsing import log_in_with_session, read, waiting
from tests.lifecycle_agents import Hurried

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15
CSP = "default-src 'self'"


class StrictCSP:
    """Middleware for this test: every page of the site under the strict policy."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response["Content-Security-Policy"] = CSP
        return response


@pytest.fixture
def strict(settings: Any) -> None:
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.admin.test_browser_insight.StrictCSP"]


_VALUES = """
return Array.from(document.querySelectorAll(arguments[0] + ' rect[data-value]')).map(
  r => [r.getAttribute('data-series'), r.getAttribute('data-category'), Number(r.getAttribute('data-value')),
        getComputedStyle(r).fill]);
"""


def test_the_dashboard_and_suggestions_draw_their_numbers_under_a_strict_policy(
    browser: webdriver.Chrome, live_server: Any, strict: None
) -> None:
    users = build_history()
    for n in range(3):  # enough for a suggestion
        runs.decide(pending_call(ALPHA, "shell", {"command": "make lint"}, 40, 200 + n), approved=True,
                    by=users["ann"], source="admin")
    viewer = make_user("vera", "nexo_django.view_decision", "nexo_django.decide_toolcall")
    browser.set_window_size(1280, 2400)
    log_in_with_session(browser, live_server.url, viewer, landing="/admin/login/")
    browser.get(f"{live_server.url}{DASHBOARD}")
    waiting(browser, WAIT).until(lambda d: read(d, "#over_time", "id") is not None)
    values = browser.execute_script(_VALUES, "#reviewers")
    counted = {(s, c): v for s, c, v, _ in values}
    assert counted == {("approved", "ann"): 6, ("denied", "ann"): 1, ("approved", "bob"): 2, ("denied", "bob"): 2}
    fills = {s: fill for s, _, _, fill in values}
    assert fills["approved"] == "rgb(46, 125, 50)" and fills["denied"] == "rgb(198, 40, 40)"  # insight.css applied
    pending = {c: v for _, c, v, _ in browser.execute_script(_VALUES, "#pending")}
    assert pending["over 7 days"] == 1 and sum(pending.values()) == 4
    save(browser, "insight-dashboard.png")
    browser.get(f"{live_server.url}{DASHBOARD}suggestions/")
    waiting(browser, WAIT).until(lambda d: read(d, "#suggestions", "id") is not None)
    assert read(browser, 'tr.suggestion[data-path="make lint"]', "data-approved") == "3"
    save(browser, "insight-suggestions.png")


def test_a_runs_timeline_is_drawn_under_a_strict_policy(
    browser: webdriver.Chrome, live_server: Any, strict: None, tmp_path: Path
) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall")
    run = Hurried.run("write a note", cwd=tmp_path)
    run.pending_calls().get().approve(by=ann)
    browser.set_window_size(1280, 1400)
    log_in_with_session(browser, live_server.url, ann, landing="/admin/login/")
    browser.get(f"{live_server.url}{run_url(run)}")
    waiting(browser, WAIT).until(lambda d: read(d, "#run-timeline", "id") is not None)
    labels = browser.execute_script(
        "return Array.from(document.querySelectorAll('#run-timeline rect[data-lane]'))"
        ".map(r => [r.getAttribute('data-lane'), r.getAttribute('data-label'), getComputedStyle(r).fill]);")
    assert [(lane, label) for lane, label, _ in labels] == [
        ("model", "turn 1"), ("people", "call_0_0 approved"), ("tools", "write"), ("model", "turn 2")]
    assert labels[1][2] == "rgb(255, 167, 38)"  # the wait's colour, from the static stylesheet
    browser.execute_script("document.getElementById('timeline').scrollIntoView()")
    save(browser, "insight-run-timeline.png")
