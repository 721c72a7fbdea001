"""A pytest plugin for rq's own worker tests, run from rq's sdist by tests/test_rq_worker_suite.py
(rq is BSD-2-licensed; its tests are not in its wheel: scripts/rq-tests fetches the sdist of the
installed release into the venv).

- rq's tests connect to ``localhost:6379``; they are pointed at ``NEXO_RQ_SUITE_REDIS``
  (``host:port``, the suite's own redis-server on a free loopback port) instead.
- The worker class rq's tests name ``Worker`` becomes ``NEXO_RQ_SUITE_WORKER``: ``Worker`` (rq's
  own, unchanged), ``SimpleWorker`` or ``ConcurrentWorker`` (nexo_django's).
- Every test that does not pass with that class is listed in :mod:`nexo_rq_expected`, with why:
  an expected failure (strict: one that starts passing fails the run), a test left out, or one
  whose outcome with that class depends on thread scheduling (not run with it).
- ``NEXO_RQ_SUITE_PARSER``: redis-py's protocol parser, ``python`` (the default: ``hiredis`` is
  hidden from this process, as on an install without the ``worker`` extra; the rest of the suite
  runs with it) or ``hiredis``. The run stops at once if redis-py did not take the one named.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import nexo_rq_expected
import pytest

WORKER = os.environ.get("NEXO_RQ_SUITE_WORKER", "Worker")
PARSER = os.environ.get("NEXO_RQ_SUITE_PARSER", "python")
if PARSER == "python":
    sys.modules["hiredis"] = None  # type: ignore[assignment]  # `import hiredis` now fails, as when absent


def _check_parser() -> None:
    import redis.connection

    taken = "hiredis" if "Hiredis" in redis.connection.DefaultParser.__name__ else "python"
    if taken != PARSER:
        raise pytest.UsageError(f"redis-py parses with {redis.connection.DefaultParser.__name__}, "
                                f"NEXO_RQ_SUITE_PARSER={PARSER!r} wanted the {PARSER} parser")


def _redirect_redis() -> None:
    import redis

    host, port = os.environ["NEXO_RQ_SUITE_REDIS"].rsplit(":", 1)
    init = redis.Redis.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        default = not args and not {"unix_socket_path", "connection_pool"} & set(kwargs)
        if default and kwargs.get("host", "localhost") == "localhost" and int(kwargs.get("port", 6379)) == 6379:
            kwargs["host"], kwargs["port"] = host, int(port)
        init(self, *args, **kwargs)

    redis.Redis.__init__ = __init__  # type: ignore[method-assign]


def _concurrent_worker() -> type:
    import django
    from django.conf import settings

    host, port = os.environ["NEXO_RQ_SUITE_REDIS"].rsplit(":", 1)
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_rq", "nexo_django"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        RQ_QUEUES={"default": {"URL": f"redis://{host}:{port}/15"}},
        USE_TZ=True,
    )
    django.setup()
    from nexo_django.durable.worker import ConcurrentWorker

    return ConcurrentWorker


def _worker_class() -> type:
    import rq

    if WORKER == "ConcurrentWorker":
        return _concurrent_worker()
    return {"Worker": rq.Worker, "SimpleWorker": rq.SimpleWorker}[WORKER]


def pytest_configure(config: pytest.Config) -> None:
    _check_parser()
    _redirect_redis()
    config.nexo_worker_class = _worker_class()  # type: ignore[attr-defined]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    cls = config.nexo_worker_class  # type: ignore[attr-defined]
    modules = {id(item.module): item.module for item in items if getattr(item, "module", None) is not None}
    fixtures = sys.modules.get("tests.fixtures")
    if fixtures is not None:
        modules[id(fixtures)] = fixtures
    for module in modules.values():
        if getattr(module, "Worker", None) is not None:
            module.Worker = cls
    left_out = {**nexo_rq_expected.LEFT_OUT, **nexo_rq_expected.UNDECIDED.get(WORKER, {})}
    expected = nexo_rq_expected.EXPECTED_FAILURES.get(WORKER, {})
    kept, deselected = [], []
    for item in items:
        if item.nodeid in left_out:
            deselected.append(item)
            continue
        reason = expected.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        kept.append(item)
    files = {item.nodeid.split("::")[0] for item in items}
    listed = {nodeid for nodeid in set(expected) | set(left_out) if nodeid.split("::")[0] in files}
    unknown = listed - {item.nodeid for item in items}
    if unknown and not any("::" in arg for arg in config.args):  # a whole file run: the list is exact
        raise pytest.UsageError(f"listed in nexo_rq_expected but not collected: {sorted(unknown)}")
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = kept
