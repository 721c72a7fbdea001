"""From the email to the decision: an approver follows the link in a notice, logs in, and
approves the call, in headless Chromium against a live server (scripted agents, inline queue,
locmem mail)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from nexo_django.models import CallStatus, Decision, RunStatus
from tests.admin.support import make_user
from tests.admin.test_browser_admin import save
from tests.browsing import waiting
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15


def test_an_approver_approves_a_call_from_the_link_in_the_email(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path, settings: Any, mailoutbox: list[Any]
) -> None:
    settings.NEXO = {"NOTIFY": {"EMAIL": True, "SITE_URL": live_server.url}}
    ann = make_user("ann", "nexo_django.decide_toolcall", password="ann-pass")
    ann.email = "ann@example.com"
    ann.save()
    run = Scribe.run("Write hi to notes.txt", cwd=tmp_path)
    call = run.pending_calls().get()
    [message] = mailoutbox
    link = next(line.split("Decide: ", 1)[1] for line in message.body.splitlines() if "Decide: " in line)
    assert link == f"{live_server.url}/admin/nexo_django/pendingapproval/{call.pk}/change/"

    browser.delete_all_cookies()
    browser.get(link)  # not logged in: the admin's login page, which comes back to the link
    browser.find_element(By.NAME, "username").send_keys("ann")
    browser.find_element(By.NAME, "password").send_keys("ann-pass")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit], button[type=submit]").click()
    waiting(browser, WAIT).until(lambda d: d.find_elements(By.ID, "decision-form"))
    assert "notes.txt" in browser.find_element(By.ID, "arguments").text
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL  # opening the link decided nothing
    save(browser, "decision-from-email.png")

    browser.find_element(By.ID, "approve").click()
    waiting(browser, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    decision = Decision.objects.get(tool_call=call)
    assert (decision.verdict, decision.decided_by, decision.source) == ("approved", ann, "admin")
