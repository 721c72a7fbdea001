"""rq's own worker tests, from the sdist of the rq release installed (issue 33, point 5), run
against nexo_django's ``ConcurrentWorker`` in place of rq's ``Worker``: every test passes but those
listed in tests/rq_suite/nexo_rq_expected.py, each with why (strict: a listed test that passes
fails this). rq's tests run in a pytest of their own (their package is named ``tests`` too), on
this suite's redis-server; the plugin tests/rq_suite/nexo_rq_plugin.py swaps the class.

``NEXO_RQ_SUITE_WORKERS=Worker,SimpleWorker,ConcurrentWorker`` runs it with rq's own classes too
(the figures compared in the issue); by default only ``ConcurrentWorker``. It runs with redis-py's
pure-Python protocol parser (an install without the ``worker`` extra); the rest of this suite's
workers run with ``hiredis``, which the ``test`` extra installs."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.redis]

REPO_ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_worker.py", "tests/test_commands.py", "tests/test_worker_registration.py"]
WORKERS = os.environ.get("NEXO_RQ_SUITE_WORKERS", "ConcurrentWorker").split(",")


def rq_tests() -> Path:
    """rq's sdist, fetched by ``make venv`` (scripts/rq-tests), or now if it was not."""
    found = subprocess.run([str(REPO_ROOT / "scripts" / "rq-tests"), sys.executable], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert found.returncode == 0, f"rq's tests could not be fetched (scripts/rq-tests):\n{found.stderr}"
    return Path(found.stdout.strip())


@pytest.mark.parametrize("worker", WORKERS)
def test_rqs_worker_tests_pass_with_the_worker_class_swapped(
    worker: str, redis_server: Any, tmp_path: Path
) -> None:
    if not redis_server.running:
        redis_server.restart()
    redis_server.flushall()
    root = rq_tests()
    report = tmp_path / "rq.xml"
    env = {**os.environ, "NEXO_RQ_SUITE_WORKER": worker, "NEXO_RQ_SUITE_REDIS": f"127.0.0.1:{redis_server.port}",
           "NEXO_RQ_SUITE_PARSER": "python",
           "PYTHONPATH": str(REPO_ROOT / "tests" / "rq_suite")}  # fmt: skip
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "nexo_rq_plugin", "-p", "no:cacheprovider", "-p", "no:django",
         "-q", "--timeout", "60", "--timeout-method", "thread", f"--junitxml={report}", *FILES],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    # pytest-timeout's thread method ends the process at once (os._exit): no report is written then,
    # and what the inner run printed (the hung test's stack) is the only account of it.
    assert report.exists(), f"rq's suite ended without its report (exit {done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, done.stdout[-3000:]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    xfailed = sum(1 for case in suite.iter("testcase") if (s := case.find("skipped")) is not None
                  and s.get("type") == "pytest.xfail")  # fmt: skip
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    print(f"rq {root.name} worker tests with {worker}: {passed} passed, {xfailed} expected failures, "
          f"{counts['skipped'] - xfailed} skipped by rq")  # fmt: skip
    assert done.returncode == 0 and counts["failures"] == counts["errors"] == 0, done.stdout[-6000:]
    assert passed >= 50, done.stdout[-3000:]
