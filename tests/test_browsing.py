"""The helpers of tests/browsing.py against a page that replaces its elements all the time, as
the run pages and the chat page do when they reload (issue 33, item 7: the browser tests raced
stale elements). Headless Chromium; no server: the page is a data: URL."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browsing import read, waiting

pytestmark = pytest.mark.browser

# Every 2 ms the status is replaced by a new element; after 100 replacements it says done.
CHURNING = """<!doctype html><span id="status"></span><script>
var n = 0;
function churn() {
  n += 1;
  document.getElementById("status").outerHTML =
    '<span id="status" data-status="' + (n >= 100 ? 'done' : 'running') + '">' + n + '</span>';
}
window.setInterval(churn, 2);
</script>"""


@pytest.fixture
def churning(browser: Any) -> Any:
    browser.get("data:text/html," + urllib.parse.quote(CHURNING))
    return browser


def test_a_plain_wait_meets_stale_elements_on_a_churning_page(churning: Any) -> None:
    # The hazard the helpers exist for: an element looked up, then read, by two commands.
    with pytest.raises(StaleElementReferenceException):
        for _ in range(50):
            WebDriverWait(churning, 10).until(lambda d: d.find_element(By.ID, "status").get_attribute("data-status") == "done")
            churning.refresh()


def test_waiting_and_read_see_the_page_through_its_churn(churning: Any) -> None:
    for _ in range(3):
        waiting(churning, 10).until(lambda d: read(d, "#status", "data-status") == "done")
        churning.refresh()
    assert read(churning, "#nowhere") is None


def test_the_process_browser_is_put_back_as_new_after_a_test(_chromium: Any, live_server: Any) -> None:
    # What a test can leave behind: a cookie, a second window, sessionStorage, another size.
    driver = _chromium.get()
    driver.get(f"{live_server.url}/admin/login/")
    driver.add_cookie({"name": "left", "value": "behind", "path": "/"})
    driver.execute_script("window.sessionStorage.setItem('left', 'behind')")
    driver.set_window_size(800, 600)
    driver.switch_to.new_window("window")
    driver.get(f"{live_server.url}/admin/login/")
    _chromium.reset()
    assert _chromium.get() is driver  # the same browser, not a new one
    assert len(driver.window_handles) == 1
    assert driver.execute_script("return location.href") == "about:blank"
    assert driver.get_window_size() == {"width": 1280, "height": 720}
    driver.get(f"{live_server.url}/admin/login/")
    assert "left" not in {cookie["name"] for cookie in driver.get_cookies()}
    assert driver.execute_script("return window.sessionStorage.getItem('left')") is None
