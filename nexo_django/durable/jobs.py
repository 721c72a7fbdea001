"""rq job entry points. They take ids only; the database holds everything else."""

from __future__ import annotations

from django.db import close_old_connections

from .journal import crash_point
from .runs import execute_run


def continue_run(run_id: str) -> str:
    crash_point("job_started")
    # A job is to a worker what a request is to a web server: a SimpleWorker runs every job in
    # one process, and a connection broken by a database restart would fail all later jobs.
    close_old_connections()
    try:
        return execute_run(run_id)
    finally:
        close_old_connections()
