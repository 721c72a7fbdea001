"""The chaos run: durable runs through real workers while workers, Redis and PostgreSQL fail.

Starts its own PostgreSQL (fsync on) and redis-server on 127.0.0.1 (tests/servers.py), ``--workers``
real ``manage.py rqworker`` processes (half forking ``Worker``, half ``SimpleWorker``, from
bench/chaos_workers.py: each may also be killed right after it took a job), and ``--runs`` runs
of ``bench.agents.ChaosAgent``, started all along the chaos: a scripted model whose four turns
each make a gated, non-idempotent call (two ``write`` calls on a local sandbox, two ``ledger``
calls that append '<run> <entry>' to a ledger file). An approver thread approves every pending
call; a reconciler thread calls ``reconcile()`` in a loop; runs that reach ``needs_attention``
are settled the way a person would: look whether the call's effect is there (the file with its
content, the ledger line), ``resolve_unknown(rerun=<it is not>)``, then ``retry()``. Meanwhile,
for ``--seconds``, a random worker is SIGKILLed (with its work horse) every ``--kill-every``
seconds and started again, Redis is FLUSHALLed ``--flushes`` times and PostgreSQL restarted
``--pg-restarts`` times (fast and immediate shutdowns, alternately). Then a drain phase with no
chaos, bounded by ``--drain`` seconds, lets the runs finish.

Workflows too (``--workflows`` of ``bench.chaos_workflows.ChaosWorkflow``: a checkpoint, a question
the approver thread answers, a checkpoint, an agent run inside, a checkpoint; each checkpoint's
function appends to a ledger), and the outbox: every notice goes to a loopback Slack server and a
loopback webhook receiver (tests/channel_servers.py). Workers die (``--die-at-boundary``) right
after a workflow step's record committed and between a notice's send and its record, during the
chaos and the drain (where most workflow passes run; each such kill follows a commit).

    python -m bench.chaos [--seconds 120] [--runs 40] [--workers 4] [--kill-every 0.4] ...

The figure: ``figure=chaos runs= done= left_queued_or_running= double_executions= lost_writes=
model_requests_repeated= ...``. ``double_executions``: ledger entries present twice that no person
chose to run again (``rerun_duplicates`` counts those a person did choose); ``lost_writes``: calls
the database says succeeded whose file or ledger line is not on disk; ``model_requests_repeated``:
turns the scripted model was asked for more than once (a worker killed after the model answered,
before the answer was written). The workflows' part: ``workflows_unfinished`` (not done when the
drain ended), ``checkpoint_double_runs`` (a checkpoint's function that ran after its result was
recorded), ``checkpoint_reruns_unrecorded`` (ran again because its worker died before the record:
at least once, as documented; not a fault), ``questions_answered_twice`` (an answer recorded for a
question answered before), ``notices_posted_twice`` (two Slack messages carrying one notice key),
``notices_undelivered`` (pending or failed once the reconciler had its minute after the drain),
``webhook_redeliveries`` (a webhook event sent again with its key, which the receiver dropped).
The schedules' part (``--schedules``, bench/chaos_schedules.py: ticked by two racing scheduler
threads during the chaos): ``slot_runs_doubled``, ``slots_half_fired``, ``schedules_not_ticking``;
``done`` and the other statuses count the chaos agents' runs, ``schedule_runs_done`` the slots'.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from typing import Any

from bench.chaos_schedules import TICKED, ChaosSchedules
from bench.common import REPO_ROOT, figure, note, scratch, setup_django
from tests.servers import wait_until

ACTIVE = ("queued", "running")
WORKER_CLASSES = ["bench.chaos_workers.DyingWorker", "bench.chaos_workers.DyingSimpleWorker"]
TERMINAL = ("done", "failed", "cancelled")


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = scratch()
        self.workspaces = self.dir / "workspaces"
        self.workspaces.mkdir()
        self.ledger = self.dir / "ledger.txt"
        self.model_log = self.dir / "model.txt"
        self.die_file = self.dir / "die-after-dequeue"
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.reruns: set[tuple[str, str]] = set()  # (workspace name, entry or path) a person re-ran
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.started = 0
        self.wf_started = 0
        self.wf_ledger = self.dir / "workflow-ledger.txt"
        self.boundary_file = self.dir / "die-at-boundary"
        self.kill_log = self.dir / "kills.txt"
        self.answers: Counter[tuple[str, str]] = Counter()  # (run, question) -> answers recorded
        self.schedules = ChaosSchedules(args.schedules)
        self.ticking = threading.Event()  # set: the scheduler threads stop

    # --- servers and workers -----------------------------------------------------------------

    def start(self) -> None:
        from tests.channel_servers import SlackServer, WebhookReceiver
        from tests.servers import PostgresServer, RedisServer

        self.pg = PostgresServer(database="chaos", fsync=True).start()
        self.redis = RedisServer().start()
        self.slack = SlackServer().start()
        self.hook = WebhookReceiver("chaos-secret").start()
        channels = {
            "slack": {"BACKEND": "slack", "TOKEN": self.slack.token, "SIGNING_SECRET": "chaos", "CHANNEL": "C0001",
                      "BASE_URL": self.slack.base_url, "ALLOW_PRIVATE": ["127.0.0.1"], "BACKOFF": 1},
            "hook": {"BACKEND": "webhook", "URL": self.hook.url, "SECRET": "chaos-secret",
                     "ALLOW_PRIVATE": ["127.0.0.1"], "BACKOFF": 1},
        }
        os.environ["BENCH_NEXO"] = json.dumps({"LEASE_SECONDS": self.args.lease, "MAX_RECOVERIES": 5,
                                               "CHANNELS": channels})
        os.environ["NEXO_CHAOS_WF_LEDGER"] = str(self.wf_ledger)
        os.environ["NEXO_CHAOS_LEDGER"] = str(self.ledger)
        os.environ["NEXO_CHAOS_MODEL_LOG"] = str(self.model_log)
        setup_django(self.pg.url + "?connect_timeout=3", redis_url=self.redis.url)
        from tests.rq_workers import RQWorkers

        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": pythonpath,
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        env["NEXO_CHAOS_DIE_FILE"] = str(self.die_file)
        env["NEXO_CHAOS_BOUNDARY_FILE"] = str(self.boundary_file)
        env["NEXO_CHAOS_KILL_LOG"] = str(self.kill_log)
        self.die_file.write_text(str(self.args.die_after_dequeue))
        self.boundary_file.write_text(str(self.args.die_at_boundary))
        from django.contrib.auth.models import Permission, User

        self.approver, _ = User.objects.get_or_create(username="chaos-approver")
        self.approver.user_permissions.add(Permission.objects.get(codename="decide_toolcall"))
        classes = WORKER_CLASSES if self.args.worker_class == "mixed" else [self.args.worker_class]
        self.groups = []
        for k, worker_class in enumerate(classes):
            count = len(range(k, self.args.workers, len(classes)))
            if count:
                self.groups.append(RQWorkers(
                    queues=["default"], redis_url=self.redis.url, env=env, log_dir=self.dir, count=count,
                    worker_class=worker_class, cwd=REPO_ROOT,
                ))  # fmt: skip
        for group in self.groups:
            group.start()
        self.slots = [(group, i) for group in self.groups for i in range(group.count)]

    def close(self) -> None:
        self.stop.set()
        for thing in [*getattr(self, "groups", []), getattr(self, "redis", None), getattr(self, "pg", None),
                      getattr(self, "slack", None), getattr(self, "hook", None)]:
            if thing is not None:
                thing.stop()

    # --- the people and the reconciler -------------------------------------------------------

    def guarded(self, name: str, step: Any, every: float, stop: threading.Event | None = None) -> None:
        """Call ``step`` until told to stop; a database or Redis error is counted, then retried."""
        from django.db import close_old_connections, connection

        stop = stop or self.stop
        while not stop.is_set():
            try:
                step()
            except Exception as exc:  # the database or Redis is down: try again
                with self.lock:
                    self.errors[f"{name}:{type(exc).__name__}"] += 1
                connection.close()
            else:
                close_old_connections()
            stop.wait(every)
        connection.close()

    def approve_pending(self) -> None:
        from nexo_django.core.errors import AlreadyDecided, StaleDecision, TransitionError
        from nexo_django.models import AgentRun, CallStatus, Notice, ToolCall

        # A person decides what a message showed: a request not yet in Slack waits. In Slack is
        # what Slack holds, not the notice's record: a worker killed between the post and its
        # record leaves the notice pending for its claim's minute, and the message already shown.
        unposted = Notice.objects.filter(channel="slack", kind="approval.requested", status="pending").exclude(
            key__in=self.posted_keys())
        for call in ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).order_by("created_at")[:50]:
            if unposted.filter(run_id=call.run_id, tool_call_id=call.tool_call_id).exists():
                continue
            try:
                call.approve(note="chaos approver", source="chaos")
                self.count("approved")
            except (AlreadyDecided, StaleDecision):
                pass
        self.answer_questions()
        for run in AgentRun.objects.filter(status="needs_attention"):
            for call in ToolCall.objects.filter(run=run, status=CallStatus.OUTCOME_UNKNOWN):
                happened = self.happened(run, call)
                try:
                    call.resolve_unknown(rerun=not happened, note="checked the effect: " + (
                        "it is there" if happened else "it is not there"))  # fmt: skip
                except AlreadyDecided:
                    continue
                self.count("resolved_unknown")
                if not happened:
                    with self.lock:
                        self.reruns.add((run.prompt, self.effect(call)))
            try:
                if run.retry():
                    self.count("retried")
            except TransitionError:
                pass

    def posted_keys(self) -> list[str]:
        """The notice keys of the messages the loopback Slack server holds (what people see)."""
        return [str(((m.get("metadata") or {}).get("event_payload") or {}).get("key"))
                for m in list(self.slack.messages.values()) if m.get("metadata")]

    def answer_questions(self) -> None:
        """A person answers each waiting workflow question (of two at once, one is recorded)."""
        from nexo_django.core.errors import AlreadyDecided
        from nexo_django.durable.workflow_runs import WorkflowRun
        from nexo_django.models import Notice, StepKind, StepStatus, WorkflowStep

        unposted = Notice.objects.filter(channel="slack", kind="question.asked", status="pending").exclude(
            key__in=self.posted_keys())
        for step in WorkflowStep.objects.filter(kind=StepKind.QUESTION, status=StepStatus.WAITING)[:50]:
            if unposted.filter(run_id=step.run_id, payload__key=step.name).exists():
                continue  # asked in Slack first, as a person would see it
            try:
                WorkflowRun.get(step.run_id).answer(step.name, "yes", by=self.approver)
            except AlreadyDecided:
                continue
            with self.lock:
                self.answers[(str(step.run_id), step.name)] += 1
            self.count("answered")

    def effect(self, call: Any) -> str:
        return str(call.args.get("entry") if call.name == "ledger" else call.args.get("path"))

    def happened(self, run: Any, call: Any) -> bool:
        """What a person checks: is the call's effect there?"""
        if call.name == "ledger":
            return f"{run.prompt} {call.args.get('entry')}" in self.ledger_lines()
        if call.name == "write":
            path = self.workspaces / run.prompt / str(call.args.get("path"))
            return path.exists() and path.read_text() == call.args.get("content")
        raise RuntimeError(f"unexpected call {call.name} in outcome_unknown")

    def ledger_lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def reconcile_round(self) -> None:
        from nexo_django.durable.recovery import reconcile

        report = reconcile()
        for key in ("requeued", "needs_attention", "failed", "resent"):
            if getattr(report, key):
                self.count(f"reconcile_{key}", len(getattr(report, key)))

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    # --- the chaos -----------------------------------------------------------------------------

    def start_runs(self, upto: int) -> None:
        """Start runs until ``upto`` were started (while the database is up)."""
        from bench.agents import ChaosAgent
        from bench.chaos_workflows import ChaosWorkflow

        while self.wf_started < min(upto * self.args.workflows // max(1, self.args.runs) + 1, self.args.workflows):
            try:
                ChaosWorkflow.run_later({"name": f"wf-{self.wf_started}"})
            except Exception as exc:  # the database is down: the next tick starts it
                self.count(f"start:{type(exc).__name__}")
                from django.db import connection

                connection.close()
                return
            self.wf_started += 1
        while self.started < min(upto, self.args.runs):
            name = f"chaos-{self.started}"
            (self.workspaces / name).mkdir(exist_ok=True)
            try:
                ChaosAgent.run_later(name, cwd=self.workspaces / name)
            except Exception as exc:  # the database is down: the next tick starts it
                self.count(f"start:{type(exc).__name__}")
                from django.db import connection

                connection.close()
                return
            self.started += 1

    def unleash(self) -> None:
        seconds = self.args.seconds
        flushes = [seconds * (k + 0.5) / self.args.flushes for k in range(self.args.flushes)]
        restarts = [seconds * (k + 0.8) / self.args.pg_restarts for k in range(self.args.pg_restarts)]
        start = time.monotonic()
        rng = random.Random(self.args.seed)
        # The runs start all along the chaos (the last ones at 85% of it), so that every kind
        # of failure meets runs in flight.
        spacing = 0.85 * seconds / max(1, self.args.runs)
        while (elapsed := time.monotonic() - start) < seconds:
            self.start_runs(int(elapsed / spacing) + 1)
            if flushes and elapsed >= flushes[0]:
                flushes.pop(0)
                with self.redis.client() as client:
                    client.flushall()
                self.count("redis_flushes")
                note(f"{elapsed:.0f}s: FLUSHALL")
            if restarts and elapsed >= restarts[0]:
                restarts.pop(0)
                immediate = self.counts["pg_restarts"] % 2 == 1
                self.pg.restart(immediate=immediate)
                self.count("pg_restarts")
                note(f"{elapsed:.0f}s: PostgreSQL restarted ({'immediate' if immediate else 'fast'} shutdown)")
            group, index = rng.choice(self.slots)
            if group.alive()[index]:
                group.kill(index, signal.SIGKILL)
                self.count("worker_kills")
            else:
                self.count("found_dead")
            group.respawn(index)
            time.sleep(self.args.kill_every)

    def after_chaos(self, tickers: list[threading.Thread]) -> None:
        """The schedulers stop (the drain must end), then one tick past every next slot."""
        from django.db import connection

        self.ticking.set()
        for thread in tickers:
            thread.join(timeout=30)
        for _ in range(20):  # PostgreSQL may still be coming back from its last restart
            try:
                self.schedules.tick_after()
                return
            except Exception as exc:
                self.count(f"tick_after:{type(exc).__name__}")
                connection.close()
                time.sleep(0.5)

    def drain(self) -> bool:
        """No more chaos: the dead workers started again (the living ones are left as they are, as
        in production after a database restart); wait (bounded) until no run is left to finish."""
        self.die_file.unlink()
        self.start_runs(self.args.runs)
        self.start_runs(10**9)  # the last workflows too
        # The kills at a step boundary and after a notice's send go on (most workflow passes run
        # now): each comes after a commit, so the runs still finish; a dead worker is started again.
        try:
            wait_until(lambda: self.respawn_dead() and self.unfinished() == 0, timeout=self.args.drain, interval=0.5,
                       what="the runs")
        except TimeoutError:
            return False
        return True

    def respawn_dead(self) -> bool:
        for group, index in self.slots:
            if not group.alive()[index]:
                group.respawn(index)
        return True

    def unfinished(self) -> int:
        from django.db import connection

        from nexo_django.models import AgentRun

        try:
            return AgentRun.objects.exclude(status__in=TERMINAL).count()
        except Exception:
            connection.close()
            return -1

    # --- the verdict ---------------------------------------------------------------------------

    def story(self, prompt: str) -> str:
        """The run's events in order, for a reader to see what happened around a repeat."""
        from nexo_django.models import RunEvent

        events = RunEvent.objects.filter(run__prompt=prompt).order_by("id").values_list("type", "data")
        return " ".join(
            f"{kind}({data.get('turn', data.get('call', ''))})" if isinstance(data, dict) else kind
            for kind, data in events
        )

    def settle_notices(self) -> int:
        """The reconciler's minute after the drain: a notice whose worker died between its send and
        its record waits for its claim to expire (a minute), then is sent again. The notices still
        pending or failed after that."""
        from datetime import timedelta

        from django.utils import timezone

        from nexo_django.durable import outbox
        from nexo_django.models import Notice, NoticeStatus

        later = timezone.now() + outbox.CLAIM + timedelta(seconds=5)
        for k in range(40):  # bounded: the updates of a request wait for its post (retry_after 2 s)
            if not outbox.deliver_due(now=later + timedelta(seconds=5 * k)) and not outbox.pending_due(
                    later + timedelta(hours=2)).exists():
                break
        return Notice.objects.filter(status__in=(NoticeStatus.PENDING, NoticeStatus.FAILED)).count()

    def workflow_verdict(self) -> dict[str, Any]:
        from nexo_django.models import AgentRun, RunKind, StepKind, WorkflowStep

        recorded = {(s.run.options.get("payload", {}).get("name"), s.name): s.created_at.timestamp()
                    for s in WorkflowStep.objects.filter(kind=StepKind.CHECKPOINT).select_related("run")}
        lines = self.wf_ledger.read_text().splitlines() if self.wf_ledger.exists() else []
        double = reruns = 0
        seen: Counter[tuple[str, str]] = Counter()
        for line in lines:
            name, step, at = line.split(" ")
            at_recorded = recorded.get((name, step))
            seen[(name, step)] += 1
            if at_recorded is not None and float(at) > at_recorded:
                double += 1
                note(f"checkpoint ran after its record: {line}")
            elif seen[(name, step)] > 1:
                reruns += 1
        missing = [key for key in recorded if key not in seen]
        for key in missing:
            note(f"checkpoint recorded but its function never ran: {key}")
        workflows = AgentRun.objects.filter(kind=RunKind.WORKFLOW)
        statuses = Counter(workflows.values_list("status", flat=True))
        for run in workflows.exclude(status="done"):
            note(f"workflow {run.options.get('payload')}: {run.status} {run.error}")
        kills = Counter(self.kill_log.read_text().split() if self.kill_log.exists() else [])
        return {
            "workflows": self.args.workflows, "workflows_done": statuses["done"],
            "workflows_unfinished": self.args.workflows - statuses["done"],
            "checkpoint_double_runs": double, "checkpoint_reruns_unrecorded": reruns,
            "checkpoints_lost": len(missing),
            "questions_answered_twice": sum(n - 1 for n in self.answers.values() if n > 1),
            "step_kills": kills["step"], "notice_kills": kills["notice"],
        }

    def outbox_verdict(self) -> dict[str, Any]:
        undelivered = self.settle_notices()
        keys = Counter(str(((m.get("metadata") or {}).get("event_payload") or {}).get("key"))
                       for m in self.slack.messages.values() if m.get("metadata"))
        for key, n in keys.items():
            if n > 1:
                note(f"posted {n} times to Slack: {key}")
        hooks = Counter(str(e.get("id")) for e in self.hook.posts)
        return {"notices_posted_twice": sum(n - 1 for n in keys.values() if n > 1), "notices_undelivered": undelivered,
                "slack_posts": len(self.slack.messages), "webhook_events": len(self.hook.received),
                "webhook_redeliveries": sum(n - 1 for n in hooks.values() if n > 1),
                "slack_history_lookups": len(self.slack.calls("conversations.history"))}

    def verdict(self, seconds: float, drained: bool) -> None:
        from nexo_django.models import AgentRun, CallStatus, RunEvent, RunKind, ToolCall

        workflows, notices = self.workflow_verdict(), self.outbox_verdict()
        statuses = Counter(AgentRun.objects.filter(kind=RunKind.AGENT, parent__isnull=True).exclude(agent=TICKED)
                           .values_list("status", flat=True))
        entries = Counter(self.ledger_lines())
        duplicates = {line: n for line, n in entries.items() if n > 1}
        rerun_duplicates = sum(n - 1 for line, n in duplicates.items() if tuple(line.split(" ", 1)) in self.reruns)
        double = sum(n - 1 for line, n in duplicates.items() if tuple(line.split(" ", 1)) not in self.reruns)
        lost = []
        for call in ToolCall.objects.filter(status=CallStatus.SUCCEEDED, name__in=("write", "ledger")).select_related("run"):
            if not self.happened(call.run, call):
                lost.append(f"{call.run.prompt} {call.name} {self.effect(call)}")
        asked = Counter(self.model_log.read_text().splitlines() if self.model_log.exists() else [])
        repeated = sum(n - 1 for n in asked.values() if n > 1)
        for run in AgentRun.objects.filter(status="failed", kind=RunKind.AGENT):
            note(f"failed: {run.prompt}: {run.error}")
        for line in lost:
            note(f"lost write: {line}")
        for line, n in duplicates.items():
            note(f"ran {n} times: {line}")
        for line, n in asked.items():
            if n > 1:
                note(f"model asked {n} times: {line}; its run's events: {self.story(line.split(' ', 1)[0])}")
        if self.errors:
            note("errors seen by the approver/reconciler threads: " + ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())))
        recovered = RunEvent.objects.filter(type="recovered").count()
        figure(
            "chaos", runs=self.args.runs, seconds=seconds, workers=self.args.workers,
            worker_class=self.args.worker_class.rsplit(".", 1)[-1], done=statuses["done"],
            found_dead=self.counts["found_dead"],
            failed=statuses["failed"], cancelled=statuses["cancelled"],
            needs_attention=statuses["needs_attention"], suspended=statuses["suspended"],
            left_queued_or_running=AgentRun.objects.filter(status__in=ACTIVE).count(), drained=drained,
            double_executions=double, rerun_duplicates=rerun_duplicates, lost_writes=len(lost),
            model_requests_repeated=repeated, worker_kills=self.counts["worker_kills"],
            redis_flushes=self.counts["redis_flushes"], pg_restarts=self.counts["pg_restarts"],
            recovered=recovered, resent=self.counts["reconcile_resent"],
            outcome_unknown_resolved=self.counts["resolved_unknown"], reruns=len(self.reruns),
            **workflows, **notices, **self.schedules.verdict(),
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=120, help="how long the chaos lasts")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=0.4, help="seconds between two worker kills")
    parser.add_argument("--flushes", type=int, default=3, help="Redis FLUSHALLs during the chaos")
    parser.add_argument("--pg-restarts", type=int, default=3, help="PostgreSQL restarts during the chaos")
    parser.add_argument("--drain", type=float, default=180, help="at most this long for the runs to finish after")
    parser.add_argument("--lease", type=int, default=5, help='NEXO["LEASE_SECONDS"] (a killed run waits this long)')
    parser.add_argument("--worker-class", default="mixed",
                        help="mixed (the default): half forking workers, half SimpleWorkers; or a dotted path")
    parser.add_argument("--die-after-dequeue", type=float, default=0.05,
                        help="probability that a worker is killed right after it took a job")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--workflows", type=int, default=10, help="workflow runs started along the chaos")
    parser.add_argument("--schedules", type=int, default=3,
                        help="schedules ticked by two racing scheduler threads during the chaos (bench/chaos_schedules.py)")
    parser.add_argument("--die-at-boundary", type=float, default=0.3,
                        help="probability that a worker is killed right after a workflow step's record "
                             "and between a notice's send and its record")
    args = parser.parse_args()

    chaos = Chaos(args)
    try:
        chaos.start()
        chaos.schedules.create()
        tickers = [threading.Thread(target=chaos.guarded, args=(f"scheduler{k}", chaos.schedules.tick, 0.25,
                                                                chaos.ticking), daemon=True) for k in range(2)]
        threads = [
            threading.Thread(target=chaos.guarded, args=("approver", chaos.approve_pending, 0.1), daemon=True),
            threading.Thread(target=chaos.guarded, args=("reconciler", chaos.reconcile_round, 0.5), daemon=True),
        ]
        started = time.monotonic()
        for thread in [*threads, *tickers]:
            thread.start()
        note(f"chaos for {args.seconds:g}s; {args.runs} runs started along it")
        chaos.unleash()
        chaos.after_chaos(tickers)
        note(f"chaos over after {time.monotonic() - started:.0f}s; draining (at most {args.drain:g}s)")
        drained = chaos.drain()
        chaos.boundary_file.unlink()
        chaos.stop.set()
        for thread in threads:
            thread.join(timeout=30)
        chaos.verdict(time.monotonic() - started, drained)
    finally:
        chaos.close()


if __name__ == "__main__":
    main()
