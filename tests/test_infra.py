"""The suite's real servers: PostgreSQL, Redis, rq worker subprocesses, and the settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import django_rq
import psycopg
import pytest
from django.contrib.auth.models import Group
from django.db import connection

from tests.dburl import parse_database_url
from tests.jobs_for_tests import copy_group, hold
from tests.servers import PostgresServer, RedisServer, pid_alive, port_open, wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


# --------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_postgres_server_accepts_psycopg_on_loopback_only(postgres_server: PostgresServer) -> None:
    with psycopg.connect(postgres_server.url, connect_timeout=5) as conn:
        row = conn.execute("SELECT current_database(), current_setting('listen_addresses')").fetchone()
    assert row == ("nexo", "127.0.0.1")


@pytest.mark.postgres
def test_postgres_server_never_runs_as_root(postgres_server: PostgresServer) -> None:
    assert _uid_of(postgres_server.pid) != 0


@pytest.mark.postgres
def test_postgres_server_stops_and_removes_its_dir_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError, match="test failed here"), PostgresServer() as server:
        port, directory, pid = server.port, server.dir, server.pid
        assert port_open(port)
        raise RuntimeError("test failed here")
    assert directory is not None
    assert (port_open(port), directory.exists(), pid_alive(pid)) == (False, False, False)


@pytest.mark.postgres
def test_postgres_clusters_are_fresh_copies_and_a_snapshot_starts_with_its_data(tmp_path: Path) -> None:
    key = f"infra-{tmp_path.name}"
    with PostgresServer(database="kept") as first:
        with psycopg.connect(first.url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("CREATE TABLE marker (note text)")
            conn.execute("INSERT INTO marker VALUES ('before the snapshot')")
        first.save_snapshot(key)
        assert not first.restored
        with psycopg.connect(first.url, connect_timeout=5, autocommit=True) as conn:  # started again
            conn.execute("INSERT INTO marker VALUES ('after it')")
        never_saved = f"{key}-never-saved"  # a fresh cluster, its database made
        with PostgresServer(database="kept", snapshot=key) as copy, PostgresServer(database="kept", snapshot=never_saved) as fresh:
            assert copy.restored and not fresh.restored
            assert len({first.dir, copy.dir, fresh.dir}) == 3
            with psycopg.connect(copy.url, connect_timeout=5) as conn:
                assert conn.execute("SELECT note FROM marker").fetchall() == [("before the snapshot",)]
            with psycopg.connect(fresh.url, connect_timeout=5) as conn:  # the database made, no table
                tables = conn.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'marker'").fetchone()
            assert tables == (0,)
            assert _uid_of(copy.pid) != 0


@pytest.mark.postgres
def test_with_postgres_script_exports_database_url_and_returns_the_exit_code() -> None:
    probe = (
        "import os, psycopg; url = os.environ['DATABASE_URL']; print(url);"
        "psycopg.connect(url, connect_timeout=5).close(); raise SystemExit(3)"
    )
    done = subprocess.run(
        [str(REPO_ROOT / "scripts" / "with-postgres"), sys.executable, "-c", probe],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    port = parse_database_url(done.stdout.strip())["PORT"]
    assert not port_open(int(port))


# --------------------------------------------------------------------------- Redis


@pytest.mark.redis
def test_redis_server_answers_on_loopback_only(redis_server: RedisServer) -> None:
    with redis_server.client() as client:
        assert (client.ping(), client.config_get("bind")["bind"]) == (True, "127.0.0.1")


@pytest.mark.redis
def test_redis_restart_keeps_the_port_and_loses_every_key() -> None:
    with RedisServer() as server, server.client() as client:
        client.set("run", "suspended")
        port, pid = server.port, server.pid
        server.restart()
        assert (server.port, server.pid != pid, client.get("run")) == (port, True, None)


@pytest.mark.redis
def test_redis_server_stops_and_removes_its_dir_on_keyboard_interrupt() -> None:
    with pytest.raises(KeyboardInterrupt), RedisServer() as server:
        port, directory, pid = server.port, server.dir, server.pid
        raise KeyboardInterrupt
    assert directory is not None
    assert (port_open(port), directory.exists(), pid_alive(pid)) == (False, False, False)


# --------------------------------------------------------------------------- rq workers


@pytest.mark.durable
@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_rq_worker_subprocess_runs_a_job_against_the_test_database(
    rq_worker: Any, redis_queue_settings: Any
) -> None:
    Group.objects.create(name="seed")
    rq_worker()
    django_rq.get_queue(redis_queue_settings.name).enqueue(copy_group, "seed")
    copy = wait_until(
        lambda: Group.objects.filter(name__startswith="seed-copy-").first(), timeout=30, what="the job's row"
    )
    assert int(copy.name.rsplit("-", 1)[1]) != os.getpid()


def _start_holding_job(rq_worker: Any, queue: Any, tmp_path: Path, count: int = 1) -> tuple[Any, int]:
    workers = rq_worker(count)
    marker = tmp_path / "job.pid"
    django_rq.get_queue(queue.name).enqueue(hold, str(marker), 60)
    text = wait_until(lambda: marker.exists() and marker.read_text(), timeout=30, what="the job to start")
    return workers, int(text)


@pytest.mark.redis
def test_rq_worker_kill_ends_the_worker_and_the_job_it_runs(
    rq_worker: Any, redis_queue_settings: Any, tmp_path: Path
) -> None:
    workers, job_pid = _start_holding_job(rq_worker, redis_queue_settings, tmp_path)
    killed = workers.kill(0)
    wait_until(lambda: not pid_alive(job_pid), timeout=5, what="the job process to die")
    assert (killed[0], job_pid in killed, workers.alive()) == (workers.pids[0], True, [False])


@pytest.mark.redis
def test_rq_workers_stop_ends_workers_even_while_a_job_runs(
    rq_worker: Any, redis_queue_settings: Any, tmp_path: Path
) -> None:
    workers, job_pid = _start_holding_job(rq_worker, redis_queue_settings, tmp_path, count=2)
    workers.stop(timeout=0.5)
    assert [pid_alive(pid) for pid in [*workers.pids, job_pid]] == [False, False, False]


@pytest.mark.redis
@pytest.mark.django_db
def test_rq_worker_refuses_a_test_whose_rows_are_rolled_back(rq_worker: Any) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"django_db\(transaction=True\)"):
        rq_worker()


@pytest.mark.redis
def test_redis_queue_settings_point_the_nexo_queue_at_the_real_redis(redis_queue_settings: Any) -> None:
    from nexo_django.conf import nexo_settings

    queue = django_rq.get_queue(nexo_settings.QUEUE)
    assert (queue.name, queue.is_async, queue.connection.ping()) == ("nexo_test", True, True)


# --------------------------------------------------------------------------- settings


def _settings_in_subprocess(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "REDIS_URL", "NEXO_TEST_"))}
    code = "import json, tests.settings as s; print(json.dumps({'db': s.DATABASES['default'], 'rq': s.RQ_QUEUES}))"
    done = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout))


def test_parse_database_url_reads_every_part_of_a_postgres_url() -> None:
    assert parse_database_url("postgresql://u%40x:p%2Fw@127.0.0.1:5433/db?sslmode=disable") == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "db",
        "USER": "u@x",
        "PASSWORD": "p/w",
        "HOST": "127.0.0.1",
        "PORT": "5433",
        "OPTIONS": {"sslmode": "disable"},
    }


def test_parse_database_url_types_the_postgres_options_django_reads_as_bool_or_int() -> None:
    options = parse_database_url("postgres://u@h:1/db?server_side_binding=True&prepare_threshold=5&sslmode=require")[
        "OPTIONS"]
    assert options == {"server_side_binding": True, "prepare_threshold": 5, "sslmode": "require"}
    with pytest.raises(ValueError, match="server_side_binding='yes': use true or false"):
        parse_database_url("postgres://u@h:1/db?server_side_binding=yes")
    with pytest.raises(ValueError, match="prepare_threshold='x': use a whole number"):
        parse_database_url("postgres://u@h:1/db?prepare_threshold=x")


def test_parse_database_url_names_the_supported_schemes_for_an_unknown_one() -> None:
    with pytest.raises(ValueError, match=r"'mysql' is not supported; use postgres://"):
        parse_database_url("mysql://root@localhost/db")


def test_settings_use_database_url_when_it_is_set() -> None:
    db = _settings_in_subprocess(DATABASE_URL="postgres://postgres@127.0.0.1:6543/nexo")["db"]
    assert (db["ENGINE"], db["NAME"], db["PORT"]) == ("django.db.backends.postgresql", "nexo", "6543")


def test_settings_default_to_a_sqlite_test_database_in_a_file() -> None:
    db = _settings_in_subprocess()["db"]
    assert (db["ENGINE"], db["TEST"]["NAME"].endswith(".sqlite3")) == ("django.db.backends.sqlite3", True)


def test_settings_run_jobs_inline_without_redis_url() -> None:
    assert _settings_in_subprocess()["rq"] == {"default": {"ASYNC": False}}


def test_settings_use_a_real_queue_with_redis_url() -> None:
    rq = _settings_in_subprocess(REDIS_URL="redis://127.0.0.1:6390/0")["rq"]
    assert rq == {"default": {"URL": "redis://127.0.0.1:6390/0"}}


def test_worker_settings_open_the_database_the_test_created() -> None:
    env = {"DATABASE_URL": "postgres://postgres@127.0.0.1:6543/nexo", "NEXO_TEST_DB_NAME": "test_nexo"}
    assert _settings_in_subprocess(**env)["db"]["NAME"] == "test_nexo"


@pytest.mark.durable
@pytest.mark.django_db
def test_suite_database_is_the_one_database_url_names() -> None:
    url = os.environ.get("DATABASE_URL")
    if url:  # the PostgreSQL pass (scripts/with-postgres)
        # pytest-xdist gives each of its processes a database of its own: test_<name>_gw<N>
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        expected = ("postgresql", "test_" + parse_database_url(url)["NAME"] + (f"_{worker}" if worker else ""))
        assert (connection.vendor, connection.settings_dict["NAME"]) == expected
    else:  # the SQLite pass: a file, so worker subprocesses can open it
        assert (connection.vendor, Path(connection.settings_dict["NAME"]).is_file()) == ("sqlite", True)


# --------------------------------------------------------------------------- teardown, for real

INNER_TESTS = '''
import os, time
from pathlib import Path

def test_fails_while_workers_run(rq_worker):
    workers = rq_worker(2)
    Path(os.environ["PIDS_FILE"]).write_text(" ".join(map(str, workers.pids)))
    assert False, "the inner test fails here"

def test_interrupted_while_workers_run(rq_worker):
    workers = rq_worker(2)
    Path(os.environ["PIDS_FILE"]).write_text(" ".join(map(str, workers.pids)))
    time.sleep(60)
'''


def _inner_pytest(tmp_path: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    """Run one of INNER_TESTS in a separate pytest process that loads tests/conftest.py."""
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    pids_file = tmp_path / "pids"
    argv = [sys.executable, "-m", "pytest", str(tmp_path / "test_inner.py"), "-k", name, "-p", "tests.conftest",
            "-c", str(REPO_ROOT / "pyproject.toml"), "--rootdir", str(REPO_ROOT), "-p", "no:cacheprovider", "-q"]  # fmt: skip
    # Not the outer run's coverage or xdist worker variables: the inner run is a plain pytest.
    outer = ("COV_CORE_", "PYTEST_XDIST", "COVERAGE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(outer)}
    env.update(PIDS_FILE=str(pids_file), PYTHONPATH=str(REPO_ROOT))
    # Ctrl-C as in a terminal, whatever the process running this test did with SIGINT (ignored
    # or blocked, the child would inherit it; under xdist the inner run once slept through it).
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint)  # fmt: skip
    return proc, pids_file


def _default_sigint() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.redis
def test_workers_of_a_failing_test_are_stopped_and_their_logs_reported(tmp_path: Path) -> None:
    proc, pids_file = _inner_pytest(tmp_path, "fails")
    output, _ = proc.communicate(timeout=120)
    pids = [int(pid) for pid in pids_file.read_text().split()]
    assert (proc.returncode, len(pids), any(map(pid_alive, pids))) == (1, 2, False), output
    assert "rq worker logs" in output and "Listening on nexo_test" in output


@pytest.mark.redis
def test_workers_are_stopped_when_the_run_is_interrupted(tmp_path: Path) -> None:
    proc, pids_file = _inner_pytest(tmp_path, "interrupted")
    try:
        text = wait_until(lambda: pids_file.exists() and pids_file.read_text(), timeout=60, what="inner workers")
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    pids = [int(pid) for pid in text.split()]
    assert (len(pids), any(map(pid_alive, pids))) == (2, False), output
    assert "KeyboardInterrupt" in output
