"""The inbox at a laptop's width, its filters, and the decision page's workspace and write diff,
in headless Chromium against a live server (scripted agents, inline queue).

Saves inbox-1280.png and decision-diff.png to tests/artifacts/ on every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from nexo_django import Agent
from nexo_django.models import RunStatus
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import INBOX, make_user
from tests.admin.test_browser_admin import log_in, save
from tests.browsing import waiting
from tests.durable_agents import ParallelScribe

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15
OLD = "# Changelog\n\n## 1.3\n- Exports\n"
NEW = "# Changelog\n\n## 1.4\n- Faster exports <b>now</b>\n\n## 1.3\n- Exports\n"


class ChangelogEditor(Agent):
    """Scripted: reads CHANGELOG.md (a write needs it), then asks to rewrite it."""

    model = ScriptedModel([
        tool_call("read", path="CHANGELOG.md"),
        tool_call("write", path="CHANGELOG.md", content=NEW),
        reply("Updated."),
    ])
    sandbox = "local"
    permissions = "approve"


def test_the_arguments_column_is_readable_at_1280_px_with_the_sidebar(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    make_user("ann", "nexo_django.decide_toolcall", password="ann-pass")
    (tmp_path / "a").mkdir()
    ParallelScribe.run("Write a.txt and b.txt.", cwd=tmp_path / "a")
    ChangelogEditor.run("Add 1.4 to the changelog.", cwd=tmp_path)
    browser.set_window_size(1280, 800)
    log_in(browser, live_server.url, "ann", "ann-pass")
    assert browser.find_element(By.ID, "nav-sidebar").is_displayed()
    save(browser, "inbox-1280.png")
    results = browser.find_element(By.CSS_SELECTOR, "#changelist .results")
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", results), (
        "the table scrolls sideways: some columns are off screen"
    )
    for cell in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-arguments"):
        assert cell.rect["width"] >= 250, f"arguments column is {cell.rect['width']}px wide"
        text = cell.find_element(By.CSS_SELECTOR, ".nexo-preview")
        # Readable: all of the preview is on screen (wrapped, not clipped or scrolled away).
        assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth + 1", text)
    assert "CHANGELOG.md" in browser.find_element(By.ID, "result_list").text


def filter_choices(driver: webdriver.Chrome, title: str) -> list[str]:
    for heading in driver.find_elements(By.CSS_SELECTOR, "#changelist-filter details, #changelist-filter h3"):
        if heading.tag_name == "details" and heading.find_element(By.TAG_NAME, "summary").text.endswith(f"By {title}"):
            return [li.text for li in heading.find_elements(By.CSS_SELECTOR, "li")][1:]  # without "All"
    raise AssertionError(f"no filter {title!r}")


def test_filters_list_only_values_some_pending_call_has(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    make_user("ann", "nexo_django.decide_toolcall", password="ann-pass")
    ChangelogEditor.run("Add 1.4 to the changelog.", cwd=tmp_path)
    log_in(browser, live_server.url, "ann", "ann-pass")
    browser.get(live_server.url + INBOX)
    assert filter_choices(browser, "capability") == ["write"]
    assert filter_choices(browser, "age") == ["less than an hour old"]
    assert filter_choices(browser, "tool") == ["write"]
    assert filter_choices(browser, "agent") == ["ChangelogEditor"]


def test_the_decision_page_shows_the_workspace_and_the_write_as_a_diff(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    make_user("ann", "nexo_django.decide_toolcall", password="ann-pass")
    (tmp_path / "CHANGELOG.md").write_text(OLD)
    run = ChangelogEditor.run("Add 1.4 to the changelog.", cwd=tmp_path)
    wait = waiting(browser, WAIT)
    browser.set_window_size(1280, 1100)
    log_in(browser, live_server.url, "ann", "ann-pass")
    browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr th a").click()
    wait.until(lambda d: d.find_elements(By.ID, "write-diff"))
    assert str(tmp_path.resolve()) in browser.find_element(By.ID, "workspace").text
    diff = browser.find_element(By.ID, "write-diff")
    added = [e.text for e in diff.find_elements(By.CSS_SELECTOR, ".add")]
    removed = [e.text for e in diff.find_elements(By.CSS_SELECTOR, ".del")]
    assert "+- Faster exports <b>now</b>" in added  # escaped: shown as text, not bold
    assert not diff.find_elements(By.TAG_NAME, "b")
    assert removed == []
    save(browser, "decision-diff.png")
    browser.find_element(By.ID, "approve").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    assert (tmp_path / "CHANGELOG.md").read_text() == NEW
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
