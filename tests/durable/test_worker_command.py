"""``manage.py nexo_worker`` refuses what cannot work before it connects to anything."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import CommandError, call_command

from nexo_django.durable.worker import ConcurrentWorker


def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(CommandError, match="--concurrency must be at least 1, not 0"):
        call_command("nexo_worker", "--concurrency", "0")


def test_a_negative_shutdown_grace_is_refused() -> None:
    with pytest.raises(CommandError, match="--shutdown-grace must be 0 or more"):
        call_command("nexo_worker", "--shutdown-grace", "-1")


def test_an_inline_queue_is_refused_with_why(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"ASYNC": False}}
    settings.NEXO = {"QUEUE": "default"}
    with pytest.raises(CommandError, match="queue 'default' is inline"):
        call_command("nexo_worker")


def test_the_worker_class_refuses_a_concurrency_below_one() -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1, not 0"):
        ConcurrentWorker(["default"], connection=object(), concurrency=0)  # type: ignore[arg-type]
