"""The approval inbox in headless Chromium against a live server (scripted agents, inline queue).

Saves inbox.png and decision.png to tests/artifacts/ on every run; with
NEXO_UPDATE_SCREENSHOTS=1 also to docs/img/ for docs/admin.md and the README.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from nexo_django import Agent
from nexo_django.models import AgentRun, RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import INBOX, make_user
from tests.browsing import waiting
from tests.durable_agents import ParallelScribe

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "img"
WAIT = 15

RELEASE_NOTES = "# Release 1.4\n\n- Faster exports\n- Fixed\u200b the login redirect\n"


class ReleaseWriter(Agent):
    """Scripted: looks around, then asks to write release notes (one zero-width space hides in them)."""

    model = ScriptedModel(
        [
            tool_call("glob", pattern="*.md"),
            [reply("I will write the release notes."), tool_call("write", path="RELEASE.md", content=RELEASE_NOTES)],
            reply("Release notes written to RELEASE.md."),
        ]
    )
    sandbox = "local"
    permissions = "approve"
    instructions = "You keep the project's release notes."


def log_in(driver: webdriver.Chrome, base: str, username: str, password: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{base}/admin/login/?next={INBOX}")
    driver.find_element(By.NAME, "username").send_keys(username)
    driver.find_element(By.NAME, "password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit], button[type=submit]").click()
    waiting(driver, WAIT).until(lambda d: d.find_elements(By.ID, "result_list"))


def save(driver: webdriver.Chrome, name: str) -> Path:
    folders = [ARTIFACTS] + ([DOC_IMAGES] if os.environ.get("NEXO_UPDATE_SCREENSHOTS") else [])
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        assert driver.save_screenshot(str(path)), f"could not save {path}"
    return ARTIFACTS / name


def test_an_approver_approves_a_call_and_sees_the_run_finish(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall", password="ann-pass")
    (tmp_path / "other").mkdir()
    ParallelScribe.run("Write a.txt and b.txt.", cwd=tmp_path / "other")
    run = ReleaseWriter.run("Write the release notes for 1.4.", cwd=tmp_path, user=ann)
    assert run.status == RunStatus.SUSPENDED
    wait = waiting(browser, WAIT)

    log_in(browser, live_server.url, "ann", "ann-pass")
    assert "Pending approvals (3 waiting)" in browser.find_element(By.TAG_NAME, "h1").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3
    # The screenshots are for the docs: without the navigation sidebar every column fits.
    browser.find_element(By.ID, "toggle-nav-sidebar").click()
    save(browser, "inbox.png")

    # Newest last: the release notes call is the third row.
    rows[2].find_element(By.CSS_SELECTOR, "th a, td a").click()
    wait.until(lambda d: d.find_elements(By.ID, "decision-form"))
    assert "RELEASE.md" in browser.find_element(By.ID, "arguments").text
    assert "⟦U+200B⟧" in browser.find_element(By.ID, "arguments").text
    assert browser.find_element(By.ID, "hidden-warning").is_displayed()
    browser.set_window_size(1280, 1350)
    save(browser, "decision.png")

    browser.find_element(By.ID, "approve").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    message = browser.find_element(By.CSS_SELECTOR, ".messagelist .success")
    assert "is done" in message.text
    message.find_element(By.TAG_NAME, "a").click()
    wait.until(lambda d: d.find_elements(By.ID, "run-status"))
    assert browser.find_element(By.ID, "run-status").text == "done"
    assert browser.find_element(By.ID, "run-result").text == "Release notes written to RELEASE.md."
    assert (tmp_path / "RELEASE.md").read_text() == RELEASE_NOTES
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE


def test_staff_without_the_permission_see_no_decision_buttons(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    make_user("vic", password="vic-pass")  # staff, without nexo_django.decide_toolcall
    run = ParallelScribe.run("Write a.txt and b.txt.", cwd=tmp_path)
    log_in(browser, live_server.url, "vic", "vic-pass")
    assert not browser.find_elements(By.CSS_SELECTOR, "select[name=action]")
    assert not browser.find_elements(By.CSS_SELECTOR, "input.action-select")
    browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")[0].find_element(By.CSS_SELECTOR, "th a").click()
    waiting(browser, WAIT).until(lambda d: d.find_elements(By.ID, "arguments"))
    assert browser.find_element(By.ID, "read-only").is_displayed()
    assert not browser.find_elements(By.ID, "approve")
    assert not browser.find_elements(By.ID, "decision-form")
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.SUSPENDED
