"""Helpers for the tests that act as a logged-in browser (the ``browser`` fixture is in
tests/conftest.py), and for pages that reload themselves under the test.

The run pages and the chat page reload when their run changes (tests/../run_detail.html,
example_project's chat.html), so an element looked up a moment ago may belong to a page that
is gone: Selenium raises ``StaleElementReferenceException``, which ``WebDriverWait`` does not
ignore by default. Waits here look elements up afresh each time and retry on stale ones; reads
look up and read in one script, which a reload cannot split.
"""

from __future__ import annotations

from typing import Any

from django.test import Client
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.support.ui import WebDriverWait

#: What a wait's condition may meet on a page that reloads itself: it looks again.
RELOADING = (NoSuchElementException, StaleElementReferenceException)

_READ = """
var e = document.querySelector(arguments[0]);
if (e === null) { return null; }
if (arguments[1] === null) { return e.innerText.trim(); }
return arguments[1] === "href" ? e.href : e.getAttribute(arguments[1]);
"""


def session_cookie(user: Any) -> str:
    """The value of a ``sessionid`` cookie in which ``user`` is logged in (a test client's)."""
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def log_in_with_session(browser: Any, base_url: str, user: Any, landing: str = "/") -> None:
    """Log ``user`` in to the browser without the login form: a test client's session cookie,
    set after a first page of the site (``landing``) gives the cookie its domain."""
    browser.get(f"{base_url}{landing}")
    browser.add_cookie({"name": "sessionid", "value": session_cookie(user), "path": "/"})


#: How often a wait looks again: Selenium's default, every 0.5 s, left each wait up to half a
#: second behind the page (a browser test waits a dozen times or more); each look is a round
#: trip to the browser, so not much more often than this.
POLL = 0.1


def waiting(browser: Any, timeout: float) -> WebDriverWait[Any]:
    """A ``WebDriverWait`` whose conditions may meet stale or missing elements: it tries again,
    every :data:`POLL` seconds."""
    return WebDriverWait(browser, timeout, poll_frequency=POLL, ignored_exceptions=RELOADING)


def read(browser: Any, css: str, attribute: str | None = None) -> str | None:
    """The visible text (or an attribute; ``href`` as the absolute URL) of the first element
    ``css`` selects in the page as it is now, or None when there is none."""
    value = browser.execute_script(_READ, css, attribute)
    return None if value is None else str(value)


def click(browser: Any, by: str, value: str, timeout: float = 15) -> None:
    """Click an element, looked up again if the page replaced it before the click landed: a
    stale element, or one whose place a new one took, was never clicked (the driver refuses),
    so trying again cannot click twice."""
    retry = (*RELOADING, ElementClickInterceptedException)
    wait = WebDriverWait(browser, timeout, poll_frequency=0.05, ignored_exceptions=retry)
    wait.until(lambda d: d.find_element(by, value).click() or True)


def settled(browser: Any) -> bool:
    """The page was loaded after its run finished: it follows nothing, so it will not reload."""
    return not browser.find_elements("css selector", "#chat-live, #run-stream, #run-poll")
