"""A workflow in headless Chromium against a live server (inline queue): the agent inside waits for
an approval, a person approves it in the inbox, the workflow asks a question, the person answers
it with the form built from its schema, and the workflow finishes. Scripted agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from nexo_django.models import RunStatus, StepStatus, WorkflowStep
from tests.admin.support import INBOX, make_user
from tests.browsing import POLL, log_in_with_session
from tests.durable_agents import count
from tests.workflows_for_tests import Release

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT = 15


def test_an_agent_inside_a_workflow_is_approved_in_the_admin_and_the_workflow_finishes_scripted(
    browser: webdriver.Chrome, live_server: Any, counter: Path
) -> None:
    ann = make_user("ann", "nexo_django.decide_toolcall")
    run = Release.run({"version": "5"})
    assert run.status == RunStatus.SUSPENDED
    wait = WebDriverWait(browser, WAIT, poll_frequency=POLL)
    log_in_with_session(browser, live_server.url, ann, landing="/admin/login/")

    browser.get(f"{live_server.url}{INBOX}")
    [row] = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert "notes.md" in row.text
    row.find_element(By.CSS_SELECTOR, "th a, td a").click()
    wait.until(lambda d: d.find_elements(By.ID, "decision-form"))
    browser.find_element(By.ID, "approve").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))

    # The agent finished; its end woke the workflow, which now asks a person.
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED and [q.key for q in run.questions()] == ["channel"]
    browser.get(f"{live_server.url}{INBOX}")
    browser.find_element(By.ID, "open-questions").click()
    wait.until(lambda d: d.find_elements(By.ID, "result_list"))
    browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr th a").click()
    wait.until(lambda d: d.find_elements(By.ID, "answer-form"))
    assert browser.find_element(By.ID, "question-text").text == "Where should this go?"
    browser.find_element(By.CSS_SELECTOR, "input[name=answer][value=blog]").click()
    browser.find_element(By.ID, "answer-submit").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))

    run.refresh_from_db()
    assert (run.status, run.result) == (RunStatus.DONE, {"published_to": "blog", "files": ["notes.md"]})
    assert WorkflowStep.objects.get(run_id=run.pk, name="channel").status == StepStatus.ANSWERED
    assert count(counter) == ["collect", "publish:blog"]
    browser.get(f"{live_server.url}/admin/nexo_django/agentrun/{run.pk}/change/")
    wait.until(lambda d: d.find_elements(By.ID, "workflow-steps"))
    assert browser.find_element(By.ID, "run-status").text == "done"
    assert "answered by ann" in browser.find_element(By.ID, "workflow-steps").text


def test_an_object_question_is_answered_in_chromium_with_a_field_per_property(
    browser: webdriver.Chrome, live_server: Any, counter: Path
) -> None:
    from tests.workflows_for_tests import Ticket

    ann = make_user("ann", "nexo_django.decide_toolcall")
    run = Ticket.run({})
    step = WorkflowStep.objects.get(run_id=run.pk, name="ticket")
    wait = WebDriverWait(browser, WAIT, poll_frequency=POLL)
    log_in_with_session(browser, live_server.url, ann, landing="/admin/login/")
    browser.get(f"{live_server.url}/admin/nexo_django/openquestion/{step.pk}/change/")
    wait.until(lambda d: d.find_elements(By.ID, "answer-form"))
    assert not browser.find_elements(By.CSS_SELECTOR, "textarea[name=answer]")  # no JSON box
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#answer-form label")]
    assert labels[:2] == ["Title:", "Priority:"]
    browser.find_element(By.NAME, "answer__0").send_keys("Fix the login")
    priority = browser.find_element(By.NAME, "answer__1")
    priority.clear()
    priority.send_keys("9")
    browser.find_element(By.ID, "answer-submit").click()
    # Chromium refuses the number past its max="5" before anything is sent.
    assert browser.execute_script("return arguments[0].validity.rangeOverflow", priority) is True
    assert WorkflowStep.objects.get(pk=step.pk).status == StepStatus.WAITING
    priority.clear()
    priority.send_keys("4")
    browser.find_element(By.CSS_SELECTOR, "input[name=answer__3][value=true]").click()
    browser.find_element(By.ID, "answer-submit").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    step.refresh_from_db()
    assert step.result == {"title": "Fix the login", "priority": 4, "notify": True}
    assert (step.answered_by, step.answer_source) == (ann, "admin")
