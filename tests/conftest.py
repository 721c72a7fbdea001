"""Fixtures that start real servers: redis-server, rq worker subprocesses, PostgreSQL.

A missing server fails the test with the apt package to install; it never skips.
PostgreSQL as the Django database comes from scripts/with-postgres (DATABASE_URL); the
``postgres_server`` fixture is a separate throwaway cluster for tests of the server itself.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.rq_workers import RQWorkers
from tests.servers import PostgresServer, RedisServer, ServerUnavailable

REPO_ROOT = Path(__file__).resolve().parent.parent
TEST_QUEUE = "nexo_test"

_WORKERS = pytest.StashKey[list[RQWorkers]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    # A failing worker test shows what its workers logged, next to the captured output.
    if report.failed:
        for workers in item.stash.get(_WORKERS, []):
            report.sections.append(("rq worker logs", workers.logs()))
    return report


# The slowest files, slowest first (seconds per file in a whole `make test` on CI's two cores:
# SQLite, then PostgreSQL where it runs there too). `make test` runs the suite in two processes,
# one file at a time each (`--dist loadfile`): a process that takes a 40-second file last ends
# alone while the other idles. Started first, slowest first, the slow files spread over both
# processes and the many small ones even out the end. xdist's own order
# (`--loadscope-reorder`, files with the most tests first) did the opposite: the single-test
# files that take half a minute each came last; the Makefile turns it off.
RUN_FIRST = (
    "tests/core/test_shell_confine.py",  # 120
    "tests/durable/test_concurrent_worker.py",  # 76, 73
    "tests/core/test_mcp.py",  # 75
    "tests/durable/test_workers.py",  # 71, 78
    "tests/test_demo.py",  # 58
    "tests/durable/test_restarts.py",  # 50
    "tests/core/test_shell_guard.py",  # 48
    "tests/durable/test_chaos.py",  # 43, one test
    "tests/test_infra.py",  # 34
    "tests/test_browser_live_page.py",  # 29, one test
    "tests/test_readme_tutorial.py",  # 27
    "tests/durable/test_queue_health.py",  # 18
    "tests/test_live_status.py",  # 15, 17, one test
    "tests/durable/test_workers_sigkill.py",  # 14, 18
    "tests/admin/test_browser_inbox.py",  # 14
    "tests/durable/test_concurrent_worker_pool.py",  # 11, one test
    "tests/durable/test_worker_parts.py",  # 11
    "tests/admin/test_browser_admin.py",  # 11
    "tests/core/test_fetch.py",  # 10
    "tests/channels/test_slack.py",  # 9, 19
    "tests/test_live_stream.py",  # 8, 19
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of RUN_FIRST first, in that order; every other test keeps its place (a stable
    sort: within a file, the order pytest-django gave the tests stays).

    ``postgresql_only`` tests test what only PostgreSQL has: deselected (not skipped) when the
    suite's database is another one, so the totals count only what ran."""
    from django.conf import settings

    if gone := [path for path in RUN_FIRST if not (REPO_ROOT / path).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py RUN_FIRST names files that are gone: {gone}")
    rank = {str(REPO_ROOT / path): i for i, path in enumerate(RUN_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(str(item.path), len(RUN_FIRST))

    items.sort(key=key)
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    kept, left_out = [], []
    for item in items:
        (left_out if item.get_closest_marker("postgresql_only") else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def _start(server: PostgresServer | RedisServer) -> None:
    try:
        server.start()
    except ServerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session, on a free loopback port."""
    server = RedisServer()
    _start(server)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL cluster for the session (not the Django test database)."""
    server = PostgresServer()
    _start(server)
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class RedisQueue:
    name: str
    url: str
    server: RedisServer

    def connection(self) -> Any:
        """A new redis.Redis client for this server; use it in a ``with`` block."""
        return self.server.client()


@pytest.fixture
def redis_queue_settings(redis_server: RedisServer, settings: Any) -> RedisQueue:
    """Point NEXO["QUEUE"] at a real queue ("nexo_test") on the session Redis, emptied first.

    django-rq 4.2 builds its Redis connection from settings on every get_queue() call, so
    the override needs no cache reset; pytest-django's ``settings`` restores both at teardown.
    """
    if not redis_server.running:
        redis_server.restart()  # a test may have stopped it
    redis_server.flushall()
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, TEST_QUEUE: {"URL": redis_server.url}}
    settings.NEXO = {**settings.NEXO, "QUEUE": TEST_QUEUE}
    return RedisQueue(name=TEST_QUEUE, url=redis_server.url, server=redis_server)


class StartWorkers(Protocol):
    def __call__(
        self, count: int = 1, *, queues: list[str] | None = None, worker_class: str = "rq.worker.Worker",
        concurrency: int | None = None, extra_args: Sequence[str] = (),
    ) -> RQWorkers: ...


@pytest.fixture
def rq_worker(
    request: pytest.FixtureRequest, redis_queue_settings: RedisQueue, tmp_path: Path
) -> Iterator[StartWorkers]:
    """A function that starts real ``manage.py rqworker`` subprocesses and waits until they
    are registered in Redis; all of them are stopped at teardown, pass or fail.

    Call it inside the test, after any settings override: the workers get the test's
    RQ_QUEUES and NEXO settings and open the same test database (so the test needs
    ``@pytest.mark.django_db(transaction=True)`` for its rows to be visible to them).
    """
    started: list[RQWorkers] = []
    request.node.stash[_WORKERS] = started

    def start(
        count: int = 1, *, queues: list[str] | None = None, worker_class: str = "rq.worker.Worker",
        concurrency: int | None = None, extra_args: Sequence[str] = (),
    ) -> RQWorkers:
        workers = RQWorkers(
            queues=queues or [redis_queue_settings.name],
            redis_url=redis_queue_settings.url,
            env=_worker_env(request, redis_queue_settings),
            log_dir=tmp_path,
            count=count,
            worker_class=worker_class,
            cwd=REPO_ROOT,
            concurrency=concurrency,
            extra_args=extra_args,
        )
        started.append(workers)
        return workers.start()

    try:
        yield start
    finally:
        for workers in started:
            workers.stop()


def _worker_env(request: pytest.FixtureRequest, queue: RedisQueue) -> dict[str, str]:
    from django.conf import settings

    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "PYTHONPATH": pythonpath,
        "PYTHONUNBUFFERED": "1",
        "REDIS_URL": queue.url,
        "NEXO_TEST_RQ_QUEUES": _as_json("RQ_QUEUES", settings.RQ_QUEUES),
        "NEXO_TEST_NEXO_SETTINGS": _as_json("NEXO", settings.NEXO),
    }
    env.pop("NEXO_TEST_DB_NAME", None)
    database = _test_database_name(request)
    if database is not None:
        env["NEXO_TEST_DB_NAME"] = database
    return env


def _test_database_name(request: pytest.FixtureRequest) -> str | None:
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or (
        marker is not None and bool(marker.kwargs.get("transaction"))
    )
    if not transactional:
        if marker is not None or "db" in request.fixturenames:
            pytest.fail(
                "rq_worker: the worker cannot see rows of a test that runs in a rolled-back "
                "transaction. Fix: @pytest.mark.django_db(transaction=True).",
                pytrace=False,
            )
        return None  # no database in this test: the workers get none either
    from django.db import connection

    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite" and (name == ":memory:" or "mode=memory" in name):
        pytest.fail(
            "rq_worker: the SQLite test database is in memory, which another process cannot "
            "open. Fix: unset NEXO_TEST_SQLITE (the default is a file in the temp dir).",
            pytrace=False,
        )
    return name


def _as_json(setting: str, value: object) -> str:
    try:
        return json.dumps(value)
    except TypeError as exc:
        pytest.fail(
            f"rq_worker passes settings.{setting} to its workers as JSON, and it holds a value "
            f"JSON cannot carry ({exc}). Fix: use a dotted path string instead of the object.",
            pytrace=False,
        )



@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file the scripted side-effect tools of tests/durable_agents.py append to, in any process."""
    path = tmp_path / "counter.txt"
    monkeypatch.setenv("NEXO_TEST_COUNTER", str(path))
    return path


@dataclass
class AsgiServer:
    url: str
    log: Path


@pytest.fixture
def asgi_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AsgiServer]:
    """A real ASGI server (uvicorn, one process) serving the admin and the run pages
    (tests/urls_runs.py) on loopback, on the test database (the test needs
    ``@pytest.mark.django_db(transaction=True)``). Stopped at teardown, pass or fail."""
    yield from _uvicorn(request, tmp_path, {"NEXO_TEST_ROOT_URLCONF": "tests.urls_runs"})


@pytest.fixture
def example_asgi_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AsgiServer]:
    """``asgi_server`` serving the example project (its app and URLs on the test settings, as the
    ``example`` fixture gives them in process); its workspace is ``tmp_path / "workspace"``."""
    yield from _uvicorn(request, tmp_path, {"NEXO_TEST_EXAMPLE_WORKSPACE": str(tmp_path / "workspace")})


def _uvicorn(request: pytest.FixtureRequest, tmp_path: Path, extra: dict[str, str]) -> Iterator[AsgiServer]:
    import subprocess
    import sys
    import time

    import httpx

    from tests.servers import free_port

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    env.pop("NEXO_TEST_DB_NAME", None)
    database = _test_database_name(request)
    if database is not None:
        env["NEXO_TEST_DB_NAME"] = database
    if "redis_queue_settings" in request.fixturenames:  # the server enqueues on the test's Redis
        from django.conf import settings

        env["NEXO_TEST_RQ_QUEUES"] = _as_json("RQ_QUEUES", settings.RQ_QUEUES)
        env["NEXO_TEST_NEXO_SETTINGS"] = _as_json("NEXO", settings.NEXO)
    log = tmp_path / "uvicorn.log"
    # The port is free when chosen, but another process (a test of the other xdist process, of a
    # pass running beside this one) can take it before uvicorn binds: then another port.
    for attempt in range(5):
        port = free_port()
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1", "--port",
                 str(port), "--log-level", "warning", "--lifespan", "off"],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):  # 20 s at most
            if process.poll() is not None:
                break
            try:
                httpx.get(f"{url}/admin/login/", timeout=1.0)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            if process.poll() is None:  # it answered and still runs
                break
        else:
            process.kill()
            process.wait(timeout=10)
            pytest.fail(f"uvicorn did not answer on {url} within 20 s:\n{log.read_text()}", pytrace=False)
        if process.poll() is None:
            break
        if "address already in use" not in log.read_text().lower() or attempt == 4:
            pytest.fail(f"uvicorn exited with {process.returncode}:\n{log.read_text()}", pytrace=False)
    try:
        yield AsgiServer(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def live_server(request: pytest.FixtureRequest, django_db_setup: None) -> Iterator[Any]:
    """pytest-django's live server, started only once the test database exists.

    pytest-django's own ``live_server`` does not wait for the database: in a process whose first
    test uses it, the server starts while ``DATABASES`` still names ``:memory:`` (the test
    database is the file in ``TEST["NAME"]``), so it hands the test's own SQLite connection to
    the server thread as if the database were in memory. Once the test database is a file, the
    server thread closes that shared connection after every request, while the test is using
    it: "Cannot operate on a closed database", or a segfault inside sqlite3. Started after
    ``django_db_setup``, the server thread opens its own connection to the file; only a
    database really in memory (``NEXO_TEST_SQLITE=:memory:``) is shared, as Django intends.
    """
    from pytest_django.live_server_helper import LiveServer

    addr = request.config.getvalue("liveserver") or os.getenv("DJANGO_LIVE_TEST_SERVER_ADDRESS") or "localhost"
    server = LiveServer(addr)
    try:
        yield server
    finally:
        server.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_WAIT = 15
BROWSER_SIZE = (1280, 720)


class _Chromium:
    """One headless Chromium per test process (per xdist process), started by the first test
    that asks for it: starting one costs about 1.3 s and as many CPU-s, and a dozen tests use
    one. After each test it is put back as if new: one blank tab (every page of the test closed,
    so nothing it left open keeps asking the live server; a new tab's sessionStorage is empty),
    no cookies, an empty cache, the first window size. If that fails (a dialog left open, a
    crashed renderer), the browser is quit and the next test starts another."""

    def __init__(self, profiles: pytest.TempPathFactory) -> None:
        self._profiles = profiles
        self.driver: Any = None

    def get(self) -> Any:
        if self.driver is None:
            self.driver = self._start()
        return self.driver

    def _start(self) -> Any:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
            pytest.fail(
                f"headless browser tests need {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver",
                pytrace=False,
            )
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        profile = self._profiles.mktemp("chromium-profile")
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--window-size={BROWSER_SIZE[0]},{BROWSER_SIZE[1]}",
                     f"--user-data-dir={profile}"):  # fmt: skip
            options.add_argument(flag)
        # Service with an explicit path: Selenium Manager never looks for (or downloads) a driver.
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(BROWSER_WAIT)
        return driver

    def reset(self) -> None:
        if self.driver is None:
            return
        from selenium.common.exceptions import WebDriverException

        driver = self.driver
        try:
            used = list(driver.window_handles)
            driver.switch_to.new_window("tab")
            blank = driver.current_window_handle
            for handle in used:
                driver.switch_to.window(handle)
                driver.close()
            driver.switch_to.window(blank)
            driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
            driver.execute_cdp_cmd("Network.clearBrowserCache", {})
            driver.set_window_size(*BROWSER_SIZE)
            if driver.window_handles != [blank] or driver.get_cookies():
                raise WebDriverException("the browser could not be put back as new")
        except WebDriverException:
            self.quit()

    def quit(self) -> None:
        driver, self.driver = self.driver, None
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()


@pytest.fixture(scope="session")
def _chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Chromium]:
    chromium = _Chromium(tmp_path_factory)
    try:
        yield chromium
    finally:
        chromium.quit()


@pytest.fixture
def browser(_chromium: _Chromium) -> Iterator[Any]:
    """Debian's headless Chromium driven by Selenium; a missing browser fails with the fix. The
    process's one browser (:class:`_Chromium`), as new: one blank tab, no cookies, no cache."""
    try:
        yield _chromium.get()
    finally:
        _chromium.reset()


@pytest.fixture
def example(settings: Any, tmp_path: Path) -> Path:
    """The example project's app and URLs on top of the test settings; returns its workspace."""
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "example_project.notes"]
    settings.ROOT_URLCONF = "example_project.urls"
    settings.LOGIN_URL = "login"
    settings.NOTES_WORKSPACE = tmp_path / "workspace"
    settings.NOTES_MODEL = None
    return tmp_path / "workspace"
