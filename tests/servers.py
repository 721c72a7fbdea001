"""Real PostgreSQL and Redis servers for the test suite (rq workers: tests/rq_workers.py).

Every server listens on 127.0.0.1 only, on a port found free at runtime, with its files in a
fresh temporary directory (a PostgreSQL cluster's data: a copy of one initdb made once per
process, or of a snapshot a test kept, see ``PostgresServer.save_snapshot``). Leaving the ``with`` block (normally, on an exception or on
KeyboardInterrupt) or calling ``stop()`` ends the process and removes the directory; an
``atexit`` hook stops whatever is still running, and on Linux the kernel signals each child
if the process that started it dies first. PostgreSQL refuses to run as root, so under root
it runs as the ``postgres`` OS user.

``with_postgres`` backs scripts/with-postgres. Only the standard library is needed for
PostgreSQL; redis-py is imported where used.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    import redis

LOOPBACK = "127.0.0.1"
PG_DEFAULT_BIN = "/usr/lib/postgresql/15/bin"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PORT_ATTEMPTS = 5


class ServerUnavailable(RuntimeError):
    """A server cannot be started on this machine; the message names the fix."""


# --------------------------------------------------------------------------- small helpers


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (callers retry if another process takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((LOOPBACK, port)) == 0


def wait_until[T](
    predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def wait_dead(pids: Sequence[int]) -> None:
    # SIGKILL is delivered asynchronously; a grandchild is not ours to wait() for.
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), timeout=STOP_TIMEOUT, what=f"pids {pids} to exit")


def signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# Loaded before any fork: calling dlopen between fork and exec is not safe.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to send ``sig`` to the child when its parent dies.

    It runs after the uid switch, so the setting survives it. It covers the case cleanup
    code cannot: the test process killed with SIGKILL. Start servers from the main thread:
    the signal fires when the starting *thread* exits.
    """
    if _LIBC is None:
        return None
    libc = _LIBC

    def preexec() -> None:
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG

    return preexec


def _end_process(proc: subprocess.Popen[bytes], signals: Sequence[int], timeout: float = STOP_TIMEOUT) -> None:
    """Send each signal in turn until ``proc`` exits; SIGKILL its whole group last."""
    for sig in signals:
        if proc.poll() is not None:
            return
        signal_quietly(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    signal_quietly(proc.pid, signal.SIGKILL)
    proc.wait()


def log_text(path: Path | None, lines: int = 40, start: int = 0) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with path.open("rb") as handle:
        handle.seek(start)
        text = handle.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- servers

_LIVE: set[_Server] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.stop()


class _Server:
    """A server process in its own temp dir; ``stop()`` is idempotent and always cleans up."""

    prefix = "nexo-server-"

    def __init__(self) -> None:
        self.port = 0
        self.dir: Path | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Self:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return log_text(self.log_path, lines)

    def _make_dir(self, base: str | None = None) -> Path:
        self.dir = Path(tempfile.mkdtemp(prefix=self.prefix, dir=base))
        _LIVE.add(self)
        self.log_path = self.dir / "server.log"
        self._log = self.log_path.open("ab")
        return self.dir

    def _stop_process(self) -> None:
        if self._proc is not None:
            _end_process(self._proc, self._stop_signals())
            self._proc = None

    def _stop_signals(self) -> Sequence[int]:
        return (signal.SIGTERM,)

    def stop(self) -> None:
        try:
            self._stop_process()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None
            _LIVE.discard(self)

    def _spawn(self, argv: Sequence[str], *, sig: int, **kwargs: Any) -> subprocess.Popen[bytes]:
        assert self._log is not None
        self._log.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: the terminal's Ctrl-C reaches only us; we stop it in order.
            start_new_session=True,
            preexec_fn=die_with_parent(sig),
            **kwargs,
        )


def find_pg_bin(bin_dir: str | None = None) -> Path:
    path = Path(bin_dir or os.environ.get("NEXO_PG_BIN") or PG_DEFAULT_BIN)
    if all((path / name).is_file() for name in ("initdb", "postgres", "pg_isready", "createdb")):
        return path
    raise ServerUnavailable(
        f"PostgreSQL server binaries not found in {path} (need initdb, postgres, "
        "pg_isready, createdb). Fix: apt-get install postgresql-15, or set NEXO_PG_BIN to the "
        "directory that holds them."
    )


def _traversable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


#: Per process: data directories copied for later clusters (key -> the kept ``data``
#: directory): a fresh initdb's (``_INITDB``) and those of :meth:`PostgresServer.save_snapshot`.
_SNAPSHOTS: dict[str, Path] = {}
_INITDB = "initdb"
_SNAPSHOTS_OWNER = os.getpid()


@atexit.register
def _drop_snapshots() -> None:
    if os.getpid() != _SNAPSHOTS_OWNER:
        return  # a forked child exiting: the copies are its parent's
    for kept in _SNAPSHOTS.values():
        shutil.rmtree(kept.parent, ignore_errors=True)
    _SNAPSHOTS.clear()


def _copy_tree(source: Path, target: Path) -> None:
    """``cp -a``: owner (the ``postgres`` user's, under root), modes and links kept."""
    done = subprocess.run(["cp", "-a", str(source), str(target)], capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cp -a {source} {target} failed: {done.stderr.decode(errors='replace')}")


class PostgresServer(_Server):
    """A throwaway PostgreSQL cluster: trust auth, fsync off, one database created. ``restart()``
    stops and starts it on the same port.

    ``url`` is ``postgres://postgres@127.0.0.1:PORT/DATABASE``; ``django_database()`` gives the
    matching ``DATABASES`` entry. ``fsync=True`` keeps PostgreSQL's durable defaults (``fsync``,
    ``synchronous_commit`` and ``full_page_writes`` on): every commit waits for its WAL flush, as
    in production. The benchmarks use it; the tests keep fsync off (their data is thrown away).
    """

    prefix = "nexo-pg-"
    superuser = "postgres"

    def __init__(
        self, *, database: str = "nexo", bin_dir: str | None = None, fsync: bool = False, snapshot: str | None = None
    ) -> None:
        super().__init__()
        self.database = database
        self.fsync = fsync
        self.snapshot = snapshot
        #: True once started from ``snapshot``'s data (its database is there already).
        self.restored = False
        self._bin_dir = bin_dir
        self._account: pwd.struct_passwd | None = None

    @property
    def url(self) -> str:
        return f"postgres://{self.superuser}@{LOOPBACK}:{self.port}/{self.database}"

    def django_database(self) -> dict[str, Any]:
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.database,
            "USER": self.superuser,
            "PASSWORD": "",
            "HOST": LOOPBACK,
            "PORT": str(self.port),
        }

    def start(self) -> Self:
        bin_dir = find_pg_bin(self._bin_dir)
        self._account = self._server_account()
        base = tempfile.gettempdir()
        if self._account is not None and not _traversable_by_others(Path(base)):
            base = "/tmp"  # the postgres user must reach its data directory
        try:
            directory = self._make_dir(base)
            if self._account is not None:
                os.chown(directory, self._account.pw_uid, self._account.pw_gid)
            restored = self._restore(self.snapshot) if self.snapshot else False
            if not restored:
                self._fresh_cluster(bin_dir)
            self._start_postmaster(bin_dir)
            if not restored:
                self._createdb(bin_dir)
            self.restored = restored
        except BaseException:
            self.stop()
            raise
        return self

    def _fresh_cluster(self, bin_dir: Path) -> None:
        """The data directory of a cluster just made: initdb once per process, copies after
        that (``cp -a`` of a fresh cluster costs a fraction of initdb). The benchmarks'
        ``fsync=True`` clusters are initdb'd each time, as before."""
        if self.fsync:
            self._initdb(bin_dir)
        elif not self._restore(_INITDB):
            self._initdb(bin_dir)
            self._keep(_INITDB)

    def _restore(self, key: str) -> bool:
        """Copy the data directory kept under ``key`` (see :meth:`save_snapshot`) into this
        server's; False when there is none in this process."""
        kept = _SNAPSHOTS.get(key)
        if kept is None:
            return False
        assert self.dir is not None
        _copy_tree(kept, self.dir / "data")
        return True

    def _keep(self, key: str) -> None:
        assert self.dir is not None
        holder = Path(tempfile.mkdtemp(prefix="nexo-pg-snapshot-"))
        _copy_tree(self.dir / "data", holder / "data")
        _SNAPSHOTS[key] = holder / "data"

    def save_snapshot(self, key: str) -> None:
        """Keep a copy of this cluster's data (the server is halted for the copy, then started
        again on its port) for servers of this process made with ``snapshot=key``: they start
        with this data instead of an empty cluster. Close every connection first."""
        if self.fsync:
            raise RuntimeError("snapshots are for the tests' clusters (fsync off)")
        self.halt()
        self._keep(key)
        self.restart()

    def _server_account(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None  # an unprivileged user runs the server as itself
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise ServerUnavailable(
                "running as root and there is no 'postgres' OS user to run PostgreSQL as "
                "(it refuses to run as root). Fix: apt-get install postgresql-15 (it creates "
                "the user), or run the tests as an unprivileged user."
            ) from None

    def _as_server_user(self) -> dict[str, Any]:
        assert self.dir is not None
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "HOME": str(self.dir)}
        options: dict[str, Any] = {"cwd": self.dir, "env": env}
        if self._account is not None:
            options.update(user=self._account.pw_uid, group=self._account.pw_gid, extra_groups=[])
        return options

    def _initdb(self, bin_dir: Path) -> None:
        assert self.dir is not None and self._log is not None
        argv = [str(bin_dir / "initdb"), "-D", str(self.dir / "data"), "-U", self.superuser,
                "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]  # fmt: skip
        self._log.flush()
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            timeout=120, check=False, **self._as_server_user(),
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed (exit {done.returncode}):\n{self.log_tail()}")

    def _postmaster(self, bin_dir: Path) -> bool:
        assert self.dir is not None and self.log_path is not None
        offset = self.log_path.stat().st_size
        argv = [
            str(bin_dir / "postgres"), "-D", str(self.dir / "data"), "-p", str(self.port),
            "-k", str(self.dir), "-c", f"listen_addresses={LOOPBACK}",
        ]  # fmt: skip
        if not self.fsync:
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self._proc = self._spawn(argv, sig=signal.SIGINT, **self._as_server_user())
        if self._wait_ready(bin_dir, offset):
            return True
        self._proc = None  # it exited because the port was taken meanwhile
        return False

    def _start_postmaster(self, bin_dir: Path) -> None:
        for _attempt in range(PORT_ATTEMPTS):
            self.port = free_port()
            if self._postmaster(bin_dir):
                return
        raise RuntimeError(f"PostgreSQL could not bind a free port in {PORT_ATTEMPTS} attempts:\n{self.log_tail()}")

    def halt(self, *, immediate: bool = False) -> None:
        """Stop the server, keeping its data: fast shutdown (clients are disconnected), or
        ``immediate``: as if it crashed (it recovers from the WAL when started again)."""
        if self.dir is None:
            raise RuntimeError("PostgresServer.halt() needs a started server")
        if self._proc is not None:
            _end_process(self._proc, (signal.SIGQUIT,) if immediate else self._stop_signals())
            self._proc = None

    def restart(self, *, immediate: bool = False) -> None:
        """``halt()`` (unless halted already) and start again on the same port."""
        self.halt(immediate=immediate)
        bin_dir = find_pg_bin(self._bin_dir)
        for _attempt in range(PORT_ATTEMPTS):
            if self._postmaster(bin_dir):
                return
            time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL could not bind port {self.port} again:\n{self.log_tail()}")

    def _wait_ready(self, bin_dir: Path, offset: int) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        probe = [str(bin_dir / "pg_isready"), "-q", "-h", LOOPBACK, "-p", str(self.port), "-U", self.superuser, "-t", "1"]
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                output = log_text(self.log_path, start=offset)
                if "already in use" in output or "could not bind" in output:
                    return False
                raise RuntimeError(f"PostgreSQL exited with {self._proc.returncode} while starting:\n{output}")
            if subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, check=False).returncode == 0:
                return True
            time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL not ready after {START_TIMEOUT:g}s:\n{self.log_tail()}")

    def _createdb(self, bin_dir: Path) -> None:
        argv = [str(bin_dir / "createdb"), "-h", LOOPBACK, "-p", str(self.port), "-U", self.superuser, self.database]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PGCONNECT_TIMEOUT": "5"}
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"createdb {self.database} failed: {done.stderr.decode(errors='replace')}")

    def _stop_signals(self) -> Sequence[int]:
        # SIGINT is PostgreSQL's "fast" shutdown (disconnects clients); SIGQUIT is "immediate".
        return (signal.SIGINT, signal.SIGQUIT)


@contextlib.contextmanager
def default_database_on_own_cluster(database: str, django_db_blocker: Any) -> Any:
    """For one test: Django's default database on a PostgreSQL cluster of its own (which the test
    may restart), migrated; the suite's database is put back afterwards, pass or fail."""
    import pytest
    from django.core.management import call_command
    from django.db import connections

    server = PostgresServer(database=database, snapshot=f"migrated:{database}")
    try:
        server.start()
    except ServerUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    saved = connections.settings["default"]
    with django_db_blocker.unblock():
        connections["default"].close()
        connections.settings["default"] = {**saved, **server.django_database(), "OPTIONS": {}}
        del connections["default"]
        try:
            if not server.restored:
                # Migrated once per process; the next tests start from a copy of the result.
                call_command("migrate", verbosity=0, interactive=False)
                connections.close_all()
                server.save_snapshot(f"migrated:{database}")
            yield server
        finally:
            connections.close_all()
            del connections["default"]
            connections.settings["default"] = saved
            server.stop()


def find_redis_server(binary: str | None = None) -> str:
    found = shutil.which(binary or os.environ.get("NEXO_REDIS_SERVER") or "redis-server")
    if found is None:
        raise ServerUnavailable(
            "redis-server not found on PATH. Fix: apt-get install redis-server "
            "(or set NEXO_REDIS_SERVER to its path)."
        )
    return found


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer(_Server):
    """A throwaway redis-server without persistence: a restart loses every key, as in prod."""

    prefix = "nexo-redis-"

    def __init__(self, *, binary: str | None = None) -> None:
        super().__init__()
        self._binary = binary

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> Self:
        binary = find_redis_server(self._binary)
        try:
            self._make_dir()
            for _attempt in range(PORT_ATTEMPTS):
                if self._launch(binary, free_port()):
                    return self
            raise RuntimeError(f"redis-server could not bind a free port:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise

    def restart(self) -> None:
        """Stop and start again on the same port; every key is gone afterwards."""
        if self.dir is None:
            raise RuntimeError("RedisServer.restart() needs a started server")
        binary = find_redis_server(self._binary)
        self._stop_process()
        for _attempt in range(PORT_ATTEMPTS):
            if self._launch(binary, self.port):
                return
            time.sleep(0.2)
        raise RuntimeError(f"redis-server could not bind port {self.port} again:\n{self.log_tail()}")

    def flushall(self) -> None:
        with self.client() as client:
            client.flushall()

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis.from_url(self.url)

    def _launch(self, binary: str, port: int) -> bool:
        assert self.dir is not None and self.log_path is not None
        self.port = port
        offset = self.log_path.stat().st_size
        argv = [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--daemonize", "no", "--protected-mode", "yes"]  # fmt: skip
        self._proc = self._spawn(argv, sig=signal.SIGTERM, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                output = log_text(self.log_path, start=offset)
                self._proc = None
                if "already in use" in output:
                    return False
                raise RuntimeError(f"redis-server exited while starting:\n{output}")
            if _redis_ping(port):
                return True
            time.sleep(0.02)
        raise RuntimeError(f"redis-server not ready after {START_TIMEOUT:g}s:\n{self.log_tail()}")


# --------------------------------------------------------------------------- CLI


def with_postgres(cmd: Sequence[str]) -> int:
    """Run ``cmd`` with DATABASE_URL pointing at a fresh PostgreSQL; return its exit code.
    ``WITH_POSTGRES_URL_OPTIONS`` (``name=value&...``), if set, is the URL's query: the
    connection's ``OPTIONS`` (tests/dburl.py)."""
    if not cmd:
        print("usage: scripts/with-postgres CMD [ARG...]", file=sys.stderr)
        return 2
    try:
        server = PostgresServer().start()
    except ServerUnavailable as exc:
        print(f"with-postgres: {exc}", file=sys.stderr)
        return 2
    try:
        options = os.environ.get("WITH_POSTGRES_URL_OPTIONS", "")
        url = server.url + (f"?{options}" if options else "")
        print(f"with-postgres: PostgreSQL ready at {url}", file=sys.stderr)
        try:
            child = subprocess.Popen(list(cmd), env={**os.environ, "DATABASE_URL": url})
        except OSError as exc:
            print(f"with-postgres: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
            return 127
        # Ctrl-C from the terminal reaches the child directly; we wait for it, then clean up.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        code = child.wait()
        return code if code >= 0 else 128 - code
    finally:
        server.stop()

