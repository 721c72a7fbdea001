"""Where rq's own worker tests and the worker classes run against them differ, each with why.

``LEFT_OUT``: tests not run with any worker class (they do not use the class under test).
``EXPECTED_FAILURES[worker]``: tests that fail with that worker class, on purpose (strict xfails:
a listed test that starts passing fails the run, so the list stays true).
``UNDECIDED[worker]``: tests not run with that worker class because their outcome with it depends on
how its threads are scheduled (a strict xfail of one of them failed the suite when it passed by chance).
"""

LEFT_OUT: dict[str, str] = {
    "tests/test_worker.py::TestWorkerSubprocess::test_run_access_self":
        "starts rq's command line (`rq worker`) in a subprocess: rq's default worker, not the class under test",
    "tests/test_worker.py::TestWorkerSubprocess::test_run_empty_queue":
        "starts rq's command line (`rq worker`) in a subprocess: rq's default worker, not the class under test",
    "tests/test_worker.py::TestWorkerSubprocess::test_run_scheduled_access_self":
        "starts rq's command line (`rq worker`) in a subprocess: rq's default worker, not the class under test",
}

EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    "Worker": {},
    "SimpleWorker": {  # rq's own SimpleWorker, as released: it runs jobs in its process, no work horse
        "tests/test_worker.py::TestWorker::test_horse_fails":
            "rq's SimpleWorker: perform_job failing ends work() (\"unhandled exception\"), the job left "
            "started (ConcurrentWorker files it as failed, as rq's Worker does)",
        "tests/test_worker.py::TestWorker::"
        "test_monitor_work_horse_handles_performed_job_with_non_zero_exit_code_and_result_ttl_0":
            "rq's SimpleWorker: tests the monitor of a work horse, which it has not",
        "tests/test_commands.py::TestCommands::test_kill_horse_command":
            "rq's SimpleWorker: no work horse to kill",
        "tests/test_commands.py::TestCommands::test_stop_job_command":
            "rq's SimpleWorker: stop-job kills the work horse, which it has not: the job runs on",
    },
    "ConcurrentWorker": {
        "tests/test_worker.py::TestWorker::test_job_timeout_moved_to_failed_job_registry":
            "a job's timeout is raised in its own thread as nexo_django's JobTimeout (a BaseException, so "
            "no tool's error handling takes it for the call's result), not rq's JobTimeoutException "
            "(SIGALRM: one per process); the job is in the failed registry, as the test wants",
        "tests/test_commands.py::TestCommands::test_kill_horse_command":
            "no work horse: kill-horse does nothing (docs/deployment.md); stop-job stops one job",
        "tests/test_commands.py::TestCommands::test_stop_job_command":
            "stop-job is raised into the job's thread, where it lands at the next Python instruction "
            "(a run's job: at its next commit); this job sleeps in time.sleep(3), a C call, and stops "
            "when it returns, after the test looked (0.25 s)",
    },
}

UNDECIDED: dict[str, dict[str, str]] = {
    "ConcurrentWorker": {
        "tests/test_worker.py::TestWorker::test_dequeue_round_robin":
            "jobs taken together start at once, each in its own thread: the order of their recorded "
            "starts is the order the threads ran in (rq's round robin only decides the order they are "
            "taken in), so the test passes or fails by scheduling (it passed in one run of three here)",
    },
}
