"""The reconciler's first look (nexo_django.durable.probe): every part asked in one statement
(scripted models, inline queue)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexo_django.durable import expiry, outbox, probe, workflow_questions, workflow_runs
from nexo_django.durable.recovery import expired_leases, reconcile
from nexo_django.models import AgentRun, CallStatus, Notice, RunStatus, ToolCall
from tests.durable_agents import Bumper

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def parts(now: object) -> dict[str, object]:
    """The querysets a reconciler round probes (as recovery.reconcile builds them)."""
    steps, children = workflow_runs.changed_since(now - timedelta(hours=1))  # type: ignore[operator]
    return {
        "expired": expired_leases(now),  # type: ignore[arg-type]
        "overdue": expiry.overdue_calls(now),  # type: ignore[arg-type]
        "questions": workflow_questions.overdue_questions(now),  # type: ignore[arg-type]
        "notices": outbox.pending_due(now),  # type: ignore[arg-type]
        "purge": outbox.purgeable(now),  # type: ignore[arg-type]
        "suspended": AgentRun.objects.filter(status=RunStatus.SUSPENDED),
        "steps": steps,
        "children": children,
    }


def test_every_queryset_is_asked_in_one_statement_and_each_answer_is_its_own() -> None:
    run = Bumper.run("bump")
    assert run.status == RunStatus.SUSPENDED
    call = run.pending_calls().get()
    ToolCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=5))
    now = timezone.now()
    asked = {**parts(now), "always": None, "never": Notice.objects.none()}
    with CaptureQueriesContext(connection) as captured:
        found = probe.existing(asked)  # type: ignore[arg-type]
    assert len(captured.captured_queries) == 1, [q["sql"][:80] for q in captured.captured_queries]
    expected = {name: True if qs is None else qs.exists() for name, qs in asked.items()}  # type: ignore[attr-defined]
    assert found == expected
    # what this state has: the overdue call and its suspended run; nothing else
    assert {name for name, yes in found.items() if yes} == {"overdue", "suspended", "always"}


def test_a_round_with_nothing_to_do_is_one_statement_and_one_with_work_still_does_it() -> None:
    run = Bumper.run("bump")
    later = timezone.now() + timedelta(hours=2)  # the call's change is older than a round looks back
    with CaptureQueriesContext(connection) as captured:
        report = reconcile(now=later)
    assert len(captured.captured_queries) == 1, [q["sql"][:80] for q in captured.captured_queries]
    assert not (report.requeued or report.expired or report.resent or report.failed)
    # A run whose lease expired is found by the same probe, and recovered.
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, lease_owner="dead", lease_expires_at=later - timedelta(seconds=1)
    )
    ToolCall.objects.filter(run_id=run.pk).update(status=CallStatus.APPROVED)
    report = reconcile(now=later)
    assert report.requeued == [str(run.pk)]
    run.refresh_from_db()
    assert run.lease_owner != "dead"
