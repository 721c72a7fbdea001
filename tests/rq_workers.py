"""Real ``manage.py rqworker`` subprocesses for tests (the ``rq_worker`` fixture uses this)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from tests.servers import (
    START_TIMEOUT,
    STOP_TIMEOUT,
    descendants,
    die_with_parent,
    log_text,
    pid_alive,
    signal_quietly,
    wait_dead,
)


class RQWorkers:
    """``count`` real ``manage.py rqworker`` subprocesses, each logging to its own file.

    ``env`` must let them open the test database and Redis (tests/conftest.py builds it).
    """

    def __init__(
        self,
        *,
        queues: Sequence[str],
        redis_url: str,
        env: Mapping[str, str],
        log_dir: Path,
        count: int = 1,
        worker_class: str = "rq.worker.Worker",
        cwd: Path | None = None,
        concurrency: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """With ``concurrency``, each process is ``manage.py nexo_worker --concurrency N`` (the
        concurrent worker) instead of ``rqworker --worker-class``."""
        self.queues = list(queues)
        self.redis_url = redis_url
        self.env = dict(env)
        self.log_dir = log_dir
        self.count = count
        self.worker_class = worker_class
        self.cwd = cwd
        self.concurrency = concurrency
        self.extra_args = list(extra_args)
        self.names: list[str] = []
        self.log_paths: list[Path] = []
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def start(self) -> Self:
        try:
            for _ in range(self.count):
                self._spawn_one()
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn_one(self, index: int | None = None) -> None:
        name = f"nexo-test-{uuid.uuid4().hex[:12]}"
        slot = len(self._procs) if index is None else index
        log_path = self.log_dir / f"rqworker-{slot}-{name}.log"
        if self.concurrency is None:
            argv = [sys.executable, "-m", "django", "rqworker", *self.queues, "--name", name,
                    "--worker-class", self.worker_class]  # fmt: skip
        else:
            argv = [sys.executable, "-m", "django", "nexo_worker", *self.queues, "--name", name,
                    "--concurrency", str(self.concurrency)]  # fmt: skip
        argv += self.extra_args
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )  # fmt: skip
        if index is None:
            self.names.append(name)
            self.log_paths.append(log_path)
            self._procs.append(proc)
        else:
            self.names[index], self.log_paths[index], self._procs[index] = name, log_path, proc

    def respawn(self, index: int) -> None:
        """Start a new process in the place of worker ``index`` (once it is dead: ``kill`` it
        first). It is not waited for: it registers in Redis once Django is set up."""
        if self._procs[index].poll() is None:
            raise RuntimeError(f"worker {index} is still running; kill it first")
        self._spawn_one(index)

    def _wait_registered(self) -> None:
        import redis
        from rq import Worker

        wanted = {f"rq:worker:{name}" for name in self.names}
        with redis.Redis.from_url(self.redis_url) as connection:
            deadline = time.monotonic() + START_TIMEOUT
            while not wanted <= set(Worker.all_keys(connection=connection)):
                for proc, path in zip(self._procs, self.log_paths, strict=True):
                    if proc.poll() is not None:
                        raise RuntimeError(f"rqworker exited with {proc.returncode} while starting:\n{log_text(path)}")
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"rqworkers not registered in Redis after {START_TIMEOUT:g}s:\n{self.logs()}")
                time.sleep(0.05)

    def kill(self, index: int = 0, sig: int = signal.SIGKILL) -> list[int]:
        """Kill worker ``index`` and the job process it forked at once, like a lost machine.

        Returns every pid signalled (the worker first).
        """
        proc = self._procs[index]
        pids = [proc.pid, *descendants(proc.pid)]
        for pid in pids:
            signal_quietly(pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(STOP_TIMEOUT)
            wait_dead(pids)
        return pids

    def alive(self) -> list[bool]:
        return [proc.poll() is None for proc in self._procs]

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM (rq's warm shutdown), then SIGKILL to the worker and everything it forked,
        once the worker has ended or has registered its death in Redis (at most ``timeout``).

        Registering its death is the last step of rq's shutdown that leaves a trace (after the
        job in flight, and nexo_worker's drain of its runs); what follows is the join of its
        pubsub thread, which waits up to 0.2 s for a message that never comes."""
        trees = {proc.pid: descendants(proc.pid) for proc in self._procs if proc.poll() is None}
        for proc in self._procs:
            if proc.poll() is None:
                signal_quietly(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with _Deaths(self.redis_url) as deaths:
            for proc, name in zip(self._procs, self.names, strict=True):
                while proc.poll() is None and time.monotonic() < deadline and not deaths.registered(name):
                    time.sleep(0.01)
        for proc in self._procs:
            pids = [proc.pid, *trees.get(proc.pid, []), *descendants(proc.pid)]
            for pid in pids:
                if pid_alive(pid):
                    signal_quietly(pid, signal.SIGKILL)
            proc.wait()
            wait_dead(pids)

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{log_text(path, 200)}" for path in self.log_paths)


class _Deaths:
    """Whether a worker has registered its death in Redis (rq's ``death`` field of its key).
    With Redis unreachable (a test stopped it) it says no, and asks no more."""

    def __init__(self, redis_url: str) -> None:
        import redis

        self._errors = (redis.RedisError, OSError)
        self._client: redis.Redis | None = redis.Redis.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()

    def registered(self, name: str) -> bool:
        if self._client is None:
            return False
        try:
            return bool(self._client.hexists(f"rq:worker:{name}", "death"))
        except self._errors:
            self._client.close()
            self._client = None
            return False
