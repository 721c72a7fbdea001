"""The inbox's "mine to decide" view and a routed call's page, in headless Chromium against a live
server (scripted agents, inline queue). Saves inbox-mine.png to tests/artifacts/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from selenium import webdriver
from selenium.webdriver.common.by import By

from nexo_django.durable.recovery import reconcile
from tests.admin.support import INBOX, make_user
from tests.admin.test_browser_admin import log_in, save
from tests.admin.test_browser_inbox import ChangelogEditor
from tests.durable.policy_support import policy
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def rows(browser: webdriver.Chrome) -> list[str]:
    return [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")]


def mine(browser: webdriver.Chrome, url: str) -> list[str]:
    browser.get(url + INBOX)
    browser.find_element(By.LINK_TEXT, "mine to decide").click()
    assert "decide=mine" in browser.current_url
    return rows(browser)


def test_mine_to_decide_lists_the_calls_routed_to_my_groups_and_the_unrouted(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    ops = Group.objects.create(name="ops")
    olga = make_user("olga", "nexo_django.decide_toolcall", password="olga-pass")
    olga.groups.add(ops)
    make_user("bob", "nexo_django.decide_toolcall", password="bob-pass")
    policy(make_user("carol", "nexo_django.decide_toolcall"), approvers=[ops])  # writes of /notes*
    (tmp_path / "notes").mkdir()
    Scribe.run("write notes", cwd=tmp_path / "notes")  # routed to ops
    ChangelogEditor.run("Add 1.4 to the changelog.", cwd=tmp_path)  # routed by no policy
    log_in(browser, live_server.url, "bob", "bob-pass")
    browser.get(live_server.url + INBOX)
    assert len(rows(browser)) == 2  # the whole inbox
    [only] = mine(browser, live_server.url)
    assert "CHANGELOG.md" in only and "notes.txt" not in only
    browser.delete_all_cookies()
    log_in(browser, live_server.url, "olga", "olga-pass")
    found = mine(browser, live_server.url)
    save(browser, "inbox-mine.png")
    assert len(found) == 2 and any("notes.txt" in r for r in found)
    notes = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr") if "notes.txt" in r.text)
    notes.find_element(By.CSS_SELECTOR, "th a, td a").click()
    assert "Decided by ops (approval policy “Notes”)" in browser.find_element(By.ID, "policy").text


def test_the_reviewers_risk_is_shown_sortable_and_filterable(
    browser: webdriver.Chrome, live_server: Any, tmp_path: Path
) -> None:
    ops = Group.objects.create(name="ops")
    olga = make_user("olga", "nexo_django.decide_toolcall", password="olga-pass")
    olga.groups.add(ops)
    carol = make_user("carol", "nexo_django.decide_toolcall")
    policy(carol, approvers=[ops], reviewer="tests.durable.reviewer_agents.HighRisk")
    (tmp_path / "notes").mkdir()
    Scribe.run("write notes", cwd=tmp_path / "notes")
    ChangelogEditor.run("Add 1.4 to the changelog.", cwd=tmp_path)  # no policy: no review
    reconcile(now=timezone.now())  # the reviewer's pass
    log_in(browser, live_server.url, "olga", "olga-pass")
    browser.get(live_server.url + INBOX)
    cell = browser.find_element(By.CSS_SELECTOR, "#result_list td.field-risk_column .nexo-risk")
    assert cell.text == "high" and cell.get_attribute("title").startswith("it overwrites the notes")
    browser.find_element(By.CSS_SELECTOR, "#result_list th.column-risk_column a").click()  # sort by it
    assert "o=" in browser.current_url and len(rows(browser)) == 2
    browser.get(live_server.url + INBOX)
    browser.find_element(By.LINK_TEXT, "high").click()
    [only] = rows(browser)
    assert "notes.txt" in only and "high" in only
    save(browser, "inbox-risk.png")
