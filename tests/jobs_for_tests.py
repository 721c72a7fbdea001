"""Tiny jobs run by real rq worker subprocesses in tests/test_infra.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django.contrib.auth.models import Group


def copy_group(source: str) -> None:
    """Read a row the test committed; write one named after it and this process's pid."""
    Group.objects.get(name=source)
    Group.objects.create(name=f"{source}-copy-{os.getpid()}")


def hold(marker: str, seconds: float) -> None:
    """Record this process's pid in ``marker``, then stay busy (a job a crash test kills)."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(seconds)
