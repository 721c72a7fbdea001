"""rq job entry points. They take ids only; the database holds everything else."""

from __future__ import annotations


def continue_run(run_id: str) -> str:
    from .runs import execute_run

    return execute_run(run_id)
