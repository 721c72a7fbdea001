"""``manage.py nexo_demo``: the example project's story, headless, start to finish.

A Scribe run waits on a gated write, a demo approver approves it, the run resumes and
finishes; the written file and the transcript are printed. The model is scripted unless
``--live`` (then ``NEXO_MODEL``); everything else is the same code path. With an inline queue
it all happens in this process; with a Redis queue a worker process started here runs the jobs.
``--serve`` prepares a demo approver account and serves the example in a browser instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Q

from nexo_django.conf import nexo_settings
from nexo_django.durable import dispatch
from nexo_django.models import TERMINAL_RUN_STATUSES, AgentRun, RunStatus
from nexo_django.views import inbox_url, visible

STORY = "example_project.notes.agents"
#: A file that marks a folder as made by this command, so a reset never empties another one.
MARKER = ".nexo_demo_workspace"
SETTLED = TERMINAL_RUN_STATUSES | {RunStatus.SUSPENDED, RunStatus.NEEDS_ATTENTION}
DEMO_PASSWORD = "approver"


class Command(BaseCommand):
    help = (
        "Play the example story headless: a run waits on a gated write, a demo approver approves it, "
        "the run finishes. Scripted model unless --live. --serve serves the example in a browser."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--live", action="store_true",
                            help="Use the real model named by NEXO_MODEL (and its API key) instead of the scripted one.")
        parser.add_argument("--workspace", default=None,
                            help="The agents' folder (default: settings.NOTES_WORKSPACE); emptied first.")
        parser.add_argument("--story", default=STORY,
                            help="Module with Scribe, Reviewer, SCRIBE_PROMPT and REVIEW_PROMPT.")
        parser.add_argument("--timeout", type=float, default=120.0,
                            help="Seconds to wait for a worker at each step.")
        parser.add_argument("--serve", action="store_true",
                            help="Create the demo approver account and run the web example (runserver, and "
                            "an rq worker when the queue uses Redis).")
        parser.add_argument("--addr", default="127.0.0.1:8000", help="With --serve: address to serve on.")

    def handle(self, *args: Any, live: bool, workspace: str | None, story: str, timeout: float,
               serve: bool, addr: str, **options: Any) -> None:
        self.timeout = timeout
        self.worker: subprocess.Popen[bytes] | None = None
        self.worker_log: IO[bytes] | None = None
        if serve and not settings.DEBUG:
            raise CommandError("nexo_demo --serve creates an account with a known password; it runs only with "
                               "DEBUG = True, on a machine of your own.")
        _require_migrated()
        folder = Path(workspace or getattr(settings, "NOTES_WORKSPACE", None) or Path.cwd() / "demo_workspace")
        # A plain `kill` must still stop the worker this command started: make it an exit.
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
        try:
            if serve:
                self.serve(folder, addr)
            else:
                self.play(self.load_story(story), folder, live)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            self.stop_worker()

    # --- the story ---------------------------------------------------------------------------

    def load_story(self, name: str) -> ModuleType:
        try:
            module = import_module(name)
        except ImportError as exc:
            raise CommandError(
                f"nexo_demo plays the example project's story and cannot import {name!r} ({exc}). "
                "Run it from a checkout of nexo_django (make demo), or pass --story your.module."
            ) from exc
        missing = [n for n in ("Scribe", "Reviewer", "SCRIBE_PROMPT", "REVIEW_PROMPT") if not hasattr(module, n)]
        if missing:
            raise CommandError(f"--story {name}: the module has no {', '.join(missing)}")
        return module

    def play(self, story: ModuleType, folder: Path, live: bool) -> None:
        options: dict[str, Any] = {"cwd": str(self.reset(folder))}
        if live:
            model = os.environ.get("NEXO_MODEL") or nexo_settings.MODEL
            if not isinstance(model, str) or not model:
                raise CommandError(
                    "--live needs a real model: set NEXO_MODEL=openai:gpt-4.1-mini with OPENAI_API_KEY "
                    "(or anthropic:claude-sonnet-4-5 with ANTHROPIC_API_KEY). See docs/example.md."
                )
            options["model"] = model
        writer, approver = self.accounts(passwords=False)
        scripted = bool(getattr(story.Scribe(**options).llm, "is_scripted", False))
        self.say("nexo_demo: the example story, headless.")
        if scripted:
            self.say("Model: SCRIPTED (nexo_django.testing.ScriptedModel). No model provider is called; the "
                     "answers are canned. Run `manage.py nexo_demo --live` with NEXO_MODEL set for a real one.")
        else:
            self.say(f"Model: {options['model']} (live: a real provider is called).")
        self.say(f"Queue: {self.describe_queue()}")
        self.say(f"Workspace: {folder} (emptied)")
        self.start_worker()

        self.step(1, f"{writer.get_username()} starts a Scribe run: Scribe.run_later(prompt, user=...)")
        self.say(f"  prompt: {story.SCRIBE_PROMPT}")
        run = story.Scribe.run_later(story.SCRIBE_PROMPT, user=writer, **options)
        self.say(f"  run {run.pk}")
        run = self.wait(run, SETTLED)
        self.say(f"  status: {run.status}")
        self.job_note(run)
        for line in self.done_calls(run):
            self.say(f"  passed without asking: {line}")
        if run.status != RunStatus.SUSPENDED:
            if scripted:
                raise CommandError(f"the scripted story should wait for a person, but the run is {run.status}: "
                                   f"{run.error or run.result}")
            self.say("  (the live model finished without a call that needs a person)")

        rounds = 0
        while run.status == RunStatus.SUSPENDED and rounds < 10:
            rounds += 1
            pending = list(run.pending_calls())
            self.step(2, "The run is suspended. Waiting for a person:")
            for call in pending:
                self.say(f"  {call.name} (call {call.tool_call_id}, capability {call.capability})")
                for key, value in call.args.items():
                    self.say(self.indent(f"{key}: {value}", "    "))
                url = self.inbox_path(call)
                if url:
                    self.say(f"  in the admin inbox: http://{self.default_addr()}{url}")
            self.step(3, f"{approver.get_username()} (the demo approver) approves: call.approve(by=approver)")
            for call in pending:
                call.approve(by=approver, note="Approved by the nexo_demo approver.")
                self.say(f"  approved {call.name} {call.tool_call_id}")
            run = self.wait(run, SETTLED)

        self.step(4, f"The run resumed and ended: {run.status}")
        self.job_note(run)
        if run.result:
            self.say(self.indent(f"answer: {run.result}", "  "))
        if run.error:
            self.say(self.indent(f"error: {run.error}", "  "))
        self.step(5, "Files in the workspace:")
        self.print_files(folder)
        self.step(6, "Transcript:")
        self.print_transcript(run)

        self.step(7, "The read-only Reviewer reads it back: Reviewer.run(prompt, user=...)")
        review = story.Reviewer.run(story.REVIEW_PROMPT, user=writer, **options)
        review = self.wait(review, SETTLED)
        self.say(f"  status: {review.status}")
        self.say(self.indent(f"answer: {review.result or review.error}", "  "))
        if scripted and (run.status != RunStatus.DONE or review.status != RunStatus.DONE):
            raise CommandError(f"the scripted story should end done, got {run.status} / {review.status}")

        self.say("")
        self.say("Explore it in a browser: make serve  (or: example_project/manage.py nexo_demo --serve)")
        self.say(f"  then open http://{self.default_addr()}/ and log in as approver / {DEMO_PASSWORD}.")
        self.say("  Start a run, watch it wait, decide it in the admin inbox, and see it finish.")
        if not dispatch.is_inline():
            self.say("  With REDIS_URL set, make serve also starts an rq worker.")

    # --- serving -----------------------------------------------------------------------------

    def serve(self, folder: Path, addr: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.accounts(passwords=True)
        self.say(f"Demo accounts: approver / {DEMO_PASSWORD} (staff, may decide calls) and writer / writer.")
        self.say(f"Queue: {self.describe_queue()}")
        self.say(f"Open http://{addr}/ and log in as approver.")
        self.start_worker()
        call_command("runserver", addr, use_reloader=False)

    # --- helpers -----------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self.stdout.write(text)

    def step(self, number: int, text: str) -> None:
        self.say("")
        self.say(f"{number}. {text}")

    def indent(self, text: str, prefix: str) -> str:
        # visible(): what a model wrote may hold terminal escapes or bidi controls; show them.
        return "\n".join(prefix + line for line in visible(str(text)).splitlines() or [""])

    def default_addr(self) -> str:
        return "127.0.0.1:8000"

    def describe_queue(self) -> str:
        name = dispatch.queue_name()
        if dispatch.is_inline():
            return (f'{name!r} is inline (RQ_QUEUES[{name!r}]["ASYNC"] is False): jobs run in this process at '
                    "commit, no Redis. Set REDIS_URL to use a real worker.")
        return f"{name!r} on Redis: a worker process started by nexo_demo runs the jobs."

    def reset(self, folder: Path) -> Path:
        if folder.exists():
            entries = list(folder.iterdir())
            if entries and not (folder / MARKER).exists():
                raise CommandError(f"refusing to empty {folder}: nexo_demo did not make it (no {MARKER} file). "
                                   "Pass --workspace with a new folder.")
            _empty(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MARKER).write_text("made by manage.py nexo_demo; emptied at each demo\n")
        return folder

    def accounts(self, *, passwords: bool) -> tuple[Any, Any]:
        """The demo's writer and approver. Their passwords are set only for --serve."""
        User = get_user_model()
        writer, _ = User.objects.get_or_create(username="writer")
        approver, _ = User.objects.get_or_create(username="approver", defaults={"is_staff": True})
        if not approver.is_staff:
            approver.is_staff = True
            approver.save(update_fields=["is_staff"])
        for user, password in ((writer, "writer"), (approver, DEMO_PASSWORD)):
            if passwords:
                user.set_password(password)
            elif not user.has_usable_password():
                user.set_unusable_password()
            user.save()
        # May see every run, open the inbox and decide calls; may change or delete nothing else.
        grants = Permission.objects.filter(content_type__app_label="nexo_django").filter(
            Q(codename__startswith="view_") | Q(codename="decide_toolcall")
        )
        approver.user_permissions.add(*grants)
        return writer, approver

    def inbox_path(self, call: Any) -> str | None:
        return inbox_url(call)

    def done_calls(self, run: AgentRun) -> list[str]:
        lines = []
        for message in run.transcript():
            if message.get("role") == "tool" and message.get("name") == "write":
                content = message.get("content") or {}
                if "error" not in content:
                    lines.append(f"write {content.get('path')} ({content.get('bytes_written')} bytes)")
        return lines

    def print_files(self, folder: Path) -> None:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)
        if not files:
            self.say("  (none)")
        for path in files:
            self.say(f"  --- {path.relative_to(folder)} ---")
            text = path.read_text(encoding="utf-8", errors="replace")
            self.say(self.indent(text[:4000], "  "))

    def print_transcript(self, run: AgentRun) -> None:
        for message in run.transcript():
            role = message.get("role")
            content = message.get("content")
            if role == "tool":
                summary = content if not isinstance(content, dict) else {
                    k: (v if not isinstance(v, str) or len(v) < 60 else v[:57] + "...") for k, v in content.items()
                }
                self.say(self.indent(f"tool {message.get('name')} -> {summary}", "  "))
                continue
            if content:
                text = content if len(content) < 200 else content[:197] + "..."
                self.say(self.indent(f"{role}: {text}", "  "))
            for call in message.get("tool_calls") or ():
                args = {k: (v if not isinstance(v, str) or len(v) < 40 else v[:37] + "...")
                        for k, v in (call.get("args") or {}).items()}
                self.say(self.indent(f"{role} calls {call.get('name')}({args})", "  "))

    def wait(self, run: AgentRun, statuses: frozenset[str]) -> AgentRun:
        """Poll the database (the source of truth) until the run reaches one of ``statuses``."""
        deadline = time.monotonic() + self.timeout
        while True:
            run.refresh_from_db()
            if run.status in statuses:
                return run
            if self.worker is not None and self.worker.poll() is not None:
                raise CommandError(f"the rq worker exited ({self.worker.returncode}):\n{self.worker_tail()}")
            if time.monotonic() > deadline:
                raise CommandError(f"run {run.pk} is still {run.status} after {self.timeout:.0f}s; is a worker "
                                   f"running?\n{self.worker_tail()}")
            time.sleep(0.1)

    def start_worker(self) -> None:
        if dispatch.is_inline():
            return
        try:
            dispatch.get_queue().connection.ping()
        except Exception as exc:  # redis raises several kinds; all mean the same here
            url = getattr(settings, "REDIS_URL", None) or "the RQ_QUEUES URL"
            raise CommandError(f"the queue uses Redis ({url}) and it does not answer ({exc}). Start "
                               "redis-server, or unset REDIS_URL for the inline queue.") from exc
        # Kept open for the worker's whole life; stop_worker() closes and removes it.
        self.worker_log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="nexo-demo-worker-", suffix=".log", delete=False
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
               "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE, "PYTHONUNBUFFERED": "1"}
        self.worker = subprocess.Popen(
            [sys.executable, "-m", "django", "rqworker", dispatch.queue_name()],
            env=env, stdin=subprocess.DEVNULL, stdout=self.worker_log, stderr=subprocess.STDOUT,
        )
        self.say(f"Worker: started an rq worker process (pid {self.worker.pid}); log in {self.worker_log.name}")

    def job_note(self, run: AgentRun) -> None:
        """With Redis, show that the run's latest job ran in the worker process."""
        if dispatch.is_inline():
            return
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        job_id = dispatch.job_id(run.pk, run.generation)
        try:
            job = Job.fetch(job_id, connection=dispatch.get_queue().connection)
        except NoSuchJobError:
            return
        self.say(f"  job {job_id} ran in the rq worker {job.worker_name}")

    def worker_tail(self) -> str:
        if self.worker_log is None:
            return ""
        return Path(self.worker_log.name).read_text(errors="replace")[-3000:]

    def stop_worker(self) -> None:
        worker, self.worker = self.worker, None
        if worker is None:
            return
        if worker.poll() is None:
            worker.terminate()  # rq: warm shutdown, the current job finishes first
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=5)
        if self.worker_log is not None:
            self.worker_log.close()
            os.unlink(self.worker_log.name)
            self.worker_log = None


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _require_migrated() -> None:
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    if executor.migration_plan(executor.loader.graph.leaf_nodes()):
        raise CommandError("the database is not migrated: run `manage.py migrate` first (make demo does).")


def _empty(folder: Path) -> None:
    """Remove what is inside ``folder`` without following links out of it."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
