"""The README's "In a Django project", followed to the letter from ``django-admin startproject``
to an approved run, in headless Chromium against ``runserver`` (the README's scripted model).

The steps are read from the README itself: each ```sh block runs line by line (``cd`` moves
on; ``pip install`` is skipped, this virtualenv already holds nexo-django from the checkout;
``runserver`` gets ``--noreload`` and a free loopback port and is stopped at the end), and each
```python block whose first line is ``# <file>: a new file | replace the file | add at the end``
is written there. Change the README and this test follows it; break a step and this test fails.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.admin.test_browser_admin import save
from tests.browsing import POLL

pytestmark = [pytest.mark.browser]

README = Path(__file__).resolve().parent.parent / "README.md"
VENV_BIN = Path(sys.executable).parent
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)
TARGET = re.compile(r"^# (\S+): (a new file|replace the file|add at the end)\n")
WAIT = 20


@dataclass
class Step:
    kind: str  # "sh" | "python"
    code: str


def tutorial() -> list[Step]:
    text = README.read_text()
    start = text.index("## In a Django project")
    section = text[start : text.index("\n## ", start + 1)]
    return [Step(kind, code) for kind, code in BLOCK.findall(section)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NEXO", "DJANGO", "REDIS", "DATABASE", "OPENAI", "ANTHROPIC", "PYTHONPATH"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(line, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"README step `{line}` failed in {cwd}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Apply every step of the README; yield the served URL and the project folder."""
    env = clean_env()
    cwd = tmp_path
    root: Path | None = None
    server: subprocess.Popen[bytes] | None = None
    log: Any = None
    url = ""
    try:
        for step in tutorial():
            if step.kind == "python":
                target = TARGET.match(step.code)
                assert target, f"a python block of the README's tutorial names no file:\n{step.code}"
                path = cwd / target.group(1)
                assert path.parent.is_dir(), f"{path.parent} does not exist when the README writes {path.name}"
                if target.group(2) == "add at the end":
                    assert path.exists(), f"the README adds to {path}, which does not exist"
                    path.write_text(path.read_text() + "\n" + step.code)
                else:
                    path.write_text(step.code)
                continue
            for line in step.code.splitlines():
                line = line.split("  #", 1)[0].strip()
                if not line:
                    continue
                if line.startswith("pip install"):
                    continue  # installed in this virtualenv already, from this checkout
                if line.startswith("cd "):
                    cwd = cwd / shlex.split(line)[1]
                    continue
                if line.endswith("manage.py runserver"):
                    root, port = cwd, free_port()
                    url = f"http://127.0.0.1:{port}"
                    log = (tmp_path / "runserver.log").open("wb")  # closed in the finally below
                    server = subprocess.Popen([*shlex.split(line), "--noreload", f"127.0.0.1:{port}"], cwd=cwd,
                                              env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL)
                    wait_for_port(port, server, tmp_path / "runserver.log")
                    continue
                if line.endswith("< make_approver.py"):
                    # The shell reads stdin only when it is not a terminal: give it the file.
                    with (cwd / "make_approver.py").open() as source:
                        done = subprocess.run(shlex.split(line.split("<")[0]), cwd=cwd, env=env, timeout=120,
                                              stdin=source, capture_output=True, text=True)
                    assert done.returncode == 0, done.stderr
                    continue
                run(line, cwd, env)
        assert server is not None and root is not None, "the README's tutorial never starts runserver"
        yield url, root
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if log is not None:
            log.close()


def wait_for_port(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"runserver exited with {server.returncode}:\n{log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"runserver did not listen on {port} within 30 s:\n{log.read_text()}")


def test_the_readme_tutorial_steps_are_all_there() -> None:
    steps = tutorial()
    files = [m.group(1) for s in steps if s.kind == "python" and (m := TARGET.match(s.code))]
    assert files == ["mysite/settings.py", "notes/agents.py", "notes/views.py", "mysite/urls.py",
                     "make_approver.py", "notes/tests.py"]
    commands = "\n".join(s.code for s in steps if s.kind == "sh")
    assert "django-admin startproject mysite" in commands
    assert 'include("nexo_django.urls")' in README.read_text()
    assert "rqworker default" in README.read_text()


def test_a_new_project_follows_the_readme_to_an_approved_run(
    project: tuple[str, Path], browser: webdriver.Chrome
) -> None:
    url, root = project
    wait = WebDriverWait(browser, WAIT, poll_frequency=POLL)
    browser.set_window_size(1280, 900)

    # Log in as the approver the README made; the start view sends us to the admin's login.
    browser.get(url + "/")
    wait.until(lambda d: d.find_elements(By.NAME, "username"))
    assert "/admin/login/" in browser.current_url
    browser.find_element(By.NAME, "username").send_keys("ann")
    browser.find_element(By.NAME, "password").send_keys("change-me")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit], button[type=submit]").click()
    wait.until(lambda d: d.find_elements(By.ID, "start"))

    # Start a run: run_later enqueues it at commit, the inline queue runs it, and it waits for a person.
    browser.find_element(By.ID, "start").click()
    wait.until(lambda d: d.find_elements(By.ID, "run-status"))
    assert re.search(r"/runs/[0-9a-f-]{36}/$", browser.current_url), browser.current_url
    run_page = browser.current_url
    assert browser.find_element(By.ID, "run-status").get_attribute("data-status") == "suspended"
    pending = browser.find_element(By.CSS_SELECTOR, ".pending")
    assert "hello.txt" in pending.text
    save(browser, "tutorial-run-waiting.png")
    assert not (root / "workspace" / "hello.txt").exists()

    # Decide it in the approval inbox.
    pending.find_element(By.CSS_SELECTOR, "a.inbox-link").click()
    wait.until(lambda d: d.find_elements(By.ID, "approve"))
    assert "hello.txt" in browser.find_element(By.ID, "arguments").text
    assert browser.find_element(By.ID, "write-preview").get_attribute("data-kind") == "new"
    assert str((root / "workspace").resolve()) in browser.find_element(By.ID, "workspace").text
    save(browser, "tutorial-decision.png")
    browser.find_element(By.ID, "approve").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".messagelist .success"))
    assert "is done" in browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text

    # The run is done and the file is written.
    browser.get(run_page)
    wait.until(lambda d: d.find_element(By.ID, "run-status").get_attribute("data-status") == "done")
    assert browser.find_element(By.ID, "run-result").text == "Wrote hello.txt."
    save(browser, "tutorial-run-done.png")
    assert (root / "workspace" / "hello.txt").read_text() == "Hello from Scribe.\n"

    # A follow-up from the run's page: answered by the script's third turn (no ModelError).
    browser.find_element(By.ID, "follow-up-prompt").send_keys("Thanks. Anything else?")
    browser.find_element(By.ID, "follow-up").click()
    wait.until(lambda d: d.current_url != run_page and d.find_elements(By.ID, "run-status"))
    wait.until(lambda d: d.find_element(By.ID, "run-status").get_attribute("data-status") in ("done", "failed"))
    assert browser.find_element(By.ID, "run-status").get_attribute("data-status") == "done"
    assert browser.find_element(By.ID, "run-result").text.startswith("(scripted) That is all my script holds")

    # No warning the tutorial does not explain: the one it names (no API key) and nothing else.
    checked = run("python manage.py check", root, clean_env())
    found = set(re.findall(r"\((\w+\.[EW]\d+)\)", checked.stdout + checked.stderr))
    assert found == {"nexo_django.W008"}, checked.stdout + checked.stderr
    assert "nexo_django.W008" in README.read_text()

    # The README's own test of the app passes too.
    tested = run("python manage.py test notes -v 2", root, clean_env())
    assert "StartTests.test_a_run_waits_for_approval_then_writes_the_file) ... ok" in tested.stderr


def test_without_the_include_line_the_redirect_is_a_no_reverse_match(tmp_path: Path) -> None:
    """Why the README insists on include("nexo_django.urls"): the same view without it fails."""
    env = clean_env()
    code = (
        "import django; from django.conf import settings; "
        "settings.configure(ROOT_URLCONF=__name__, INSTALLED_APPS=['nexo_django']); django.setup(); "
        "from django.shortcuts import redirect; urlpatterns = []\n"
        "try:\n    redirect('nexo_django:run_detail', '00000000-0000-0000-0000-000000000000')\n"
        "except Exception as exc:\n    print(type(exc).__name__)\n"
    )
    shown = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=60)
    assert shown.stdout.strip() == "NoReverseMatch", shown.stderr
