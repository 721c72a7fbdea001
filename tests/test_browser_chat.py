"""The example's chat page in headless Chromium under a real ASGI server (uvicorn), issue 25
point 4: ask; the call waits inline with a link to its decision page; approve it there; the
chat page, untouched, follows the run (its event stream) to the answer; ask a follow-up, which
continues the conversation. The answer is seen growing piece by piece: on PostgreSQL the pieces
reach the page's stream by NOTIFY; on SQLite the approver's request, which runs the resume (inline
queue), hands them to the chat page's stream in the same server process. Scripted model (the
Helper's story, streamed word by word)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from selenium.webdriver.common.by import By

from example_project.notes.agents import CHAT_ANSWER, FOLLOW_UP_ANSWER, SUMMARY
from nexo_django.models import AgentRun, RunStatus
from tests.browsing import click, log_in_with_session, read, settled, waiting

pytestmark = [pytest.mark.browser, pytest.mark.durable, pytest.mark.django_db(transaction=True)]

WAIT = 20


def _answers(browser: Any) -> list[str]:
    # One script, not an element at a time: the page may reload between two looks.
    return list(browser.execute_script(
        "return Array.from(document.querySelectorAll('.bubble.answer .answer-text')).map(e => e.textContent)"
    ))


def test_question_approval_inline_answer_and_follow_up_in_the_browser_scripted(
    browser: Any, example_asgi_server: Any, django_user_model: Any, tmp_path: Any
) -> None:
    ann = django_user_model.objects.create_user("ann", password="x", is_staff=True)
    ann.user_permissions.add(Permission.objects.get(codename="decide_toolcall"),
                             *Permission.objects.filter(codename__startswith="view_", content_type__app_label="nexo_django"))
    url = example_asgi_server.url
    wait = waiting(browser, WAIT)
    log_in_with_session(browser, url, ann, "/accounts/login/")

    # Ask.
    browser.get(f"{url}/chat/")
    prompt = browser.find_element(By.NAME, "prompt")
    prompt.clear()
    prompt.send_keys("Summarise the release, please.")
    click(browser, By.ID, "ask-button")
    wait.until(lambda d: d.find_elements(By.ID, "waiting"))
    run = AgentRun.objects.get()
    assert browser.current_url == f"{url}/chat/{run.pk}/" and run.status == RunStatus.SUSPENDED
    assert "published/summary.md" in (read(browser, "#waiting") or "")
    decide = str(read(browser, "#waiting a.decide-link", "href"))
    chat_window = browser.current_window_handle

    # Approve on the decision page, in a second window; the chat page is left as it is.
    browser.switch_to.new_window("window")
    browser.get(decide)
    click(browser, By.ID, "approve")
    wait.until(lambda d: AgentRun.objects.get(pk=run.pk).status == RunStatus.DONE)

    # The chat page followed the run by itself: the answer is there.
    browser.switch_to.window(chat_window)
    # Settled: loaded after the run finished, so no reload is pending under the next steps.
    wait.until(lambda d: CHAT_ANSWER in _answers(d) and settled(d))
    grew = int(browser.execute_script("return Number(window.sessionStorage.getItem('chat-deltas') || '0')"))
    assert grew > 1  # seen growing, piece by piece, before the finished answer replaced it
    assert (tmp_path / "workspace" / "published" / "summary.md").read_text() == SUMMARY

    # Ask a follow-up: the same conversation, a new run.
    browser.find_element(By.NAME, "prompt").send_keys("What did I ask you?")
    click(browser, By.ID, "ask-button")
    wait.until(lambda d: FOLLOW_UP_ANSWER in _answers(d) and settled(d))
    follow = AgentRun.objects.get(previous=run)
    assert browser.current_url == f"{url}/chat/{follow.pk}/" and follow.status == RunStatus.DONE
    assert _answers(browser) == [CHAT_ANSWER, FOLLOW_UP_ANSWER]
    assert "Summarise the release, please." in (read(browser, "#chat") or "")
