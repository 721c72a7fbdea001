"""A person walks the example in headless Chromium: start a run, see it wait, approve the call in
the admin inbox, and watch the run's page turn to done by itself (scripted model, inline queue)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from selenium import webdriver
from selenium.webdriver.common.by import By

from example_project.notes.agents import NOTES
from nexo_django.models import AgentRun
from tests.browsing import click, read, settled, waiting

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15  # seconds; the run page polls every 3 s while a run waits


def status_of(driver: webdriver.Chrome) -> str | None:
    # Looked up and read in one script: the page reloads itself when the run changes.
    return read(driver, "#run-status", "data-status")


def test_a_person_starts_a_run_approves_it_in_the_admin_and_sees_it_finish(
    browser: webdriver.Chrome, live_server: Any, example: Path
) -> None:
    approver = User.objects.create_user("approver", password="demo-pass", is_staff=True)
    approver.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="nexo_django", codename__startswith="view_"),
        Permission.objects.get(codename="decide_toolcall"),
    )
    wait = waiting(browser, WAIT)

    # Log in, then start a Scribe run from the example's form.
    browser.get(live_server.url + "/")
    browser.find_element(By.NAME, "username").send_keys("approver")
    browser.find_element(By.NAME, "password").send_keys("demo-pass")
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait.until(lambda d: d.find_elements(By.ID, "start-run"))
    prompt = browser.find_element(By.NAME, "prompt")
    prompt.clear()
    prompt.send_keys("Publish the release notes.")
    click(browser, By.CSS_SELECTOR, "#start-run button[type=submit]")

    # The run's page: it waits for a person on the write into published/.
    wait.until(lambda d: d.find_elements(By.ID, "run-status"))
    run = AgentRun.objects.get()
    assert browser.current_url == f"{live_server.url}/runs/{run.pk}/"
    assert status_of(browser) == "suspended"
    assert "published/notes.md" in (read(browser, ".pending") or "")
    inbox = read(browser, ".pending a.inbox-link", "href")
    run_window = browser.current_window_handle

    # Approve it in the admin inbox, in a second window.
    browser.switch_to.new_window("window")
    browser.get(str(inbox))
    assert "published/notes.md" in browser.find_element(By.ID, "arguments").text
    browser.find_element(By.ID, "approve").click()
    wait.until(lambda d: "/change/" not in d.current_url or d.find_elements(By.CSS_SELECTOR, ".messagelist"))

    # Back on the run's page, untouched since: it refreshes itself and shows the finished run.
    browser.switch_to.window(run_window)
    wait.until(lambda d: status_of(d) == "done" and settled(d))
    assert "(scripted model) Drafted drafts/notes.md and published published/notes.md." in (
        read(browser, "#run-result") or ""
    )
    assert not browser.find_elements(By.CSS_SELECTOR, ".pending")
    assert (example / "published" / "notes.md").read_text() == NOTES
