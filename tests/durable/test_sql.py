"""nexo_django.durable.sql writes the rows the ORM would write, and reads them as the ORM reads them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Model
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext

from nexo_django.durable import savers, sql
from nexo_django.durable.fixed import PENDING_APPROVAL, Fixed
from nexo_django.models import (
    AgentRun,
    CallStatus,
    Decision,
    RunEvent,
    RunMessage,
    RunStatus,
    ToolCall,
    Verdict,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

#: JSON that a serialiser could get wrong: unicode beyond the BMP, invisible and bidi characters,
#: quotes and backslashes, JSON null inside a value, numbers, nesting, an empty key.
AWKWARD_JSON: dict[str, Any] = {
    "text": "ünïcödé 🚀 \u202eevil\u202c \u200b \"quoted\" \\back\\slash\n",
    "none": None,
    "numbers": [0, -1, 2**53, 1.5, True, False],
    "nested": {"list": [{"k": "v"}, [], {}], "": "empty key"},
}
WHEN = datetime(2026, 11, 30, 23, 59, 58, 123456, tzinfo=UTC)


def stored(model: type[Model], pk: Any) -> tuple[Any, ...]:
    """The row's columns exactly as the database holds them (no conversion), primary key aside."""
    meta = model._meta
    columns = [f.column for f in meta.concrete_fields if not f.primary_key]
    q = connection.ops.quote_name
    select = ", ".join(q(c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {select} FROM {q(meta.db_table)} WHERE {q(meta.pk.column)} = %s",
            [meta.pk.get_db_prep_value(pk, connection)],
        )
        return tuple(cursor.fetchone())


def fields(obj: Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def a_run(**extra: Any) -> AgentRun:
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:8]}")
    values: dict[str, Any] = {
        "agent": "tests.durable_agents.Scribe", "prompt": "Schreib «hallo» ✍️", "status": RunStatus.RUNNING,
        "result": None, "error": "", "created_by": user, "finished_at": None, "usage": {"input_tokens": 3},
        "options": AWKWARD_JSON, "workspace": None, "lease_owner": "tok-ü", "lease_expires_at": WHEN,
        "generation": 7,
    }
    return AgentRun(**{**values, **extra})


def test_a_run_created_here_is_stored_as_the_orm_stores_it() -> None:
    by_orm = a_run()
    by_orm.save(force_insert=True)
    here = a_run(created_by=by_orm.created_by)
    sql.create(here)
    assert not here._state.adding
    columns = [f.column for f in AgentRun._meta.concrete_fields if not f.primary_key]
    ours = dict(zip(columns, stored(AgentRun, here.pk), strict=True))
    theirs = dict(zip(columns, stored(AgentRun, by_orm.pk), strict=True))
    # auto_now / auto_now_add differ by the moment of the write; everything else byte for byte.
    for moment in ("created_at", "updated_at"):
        assert ours.pop(moment) is not None and theirs.pop(moment) is not None
    assert ours == theirs
    back = AgentRun.objects.get(pk=here.pk)
    assert fields(back) == fields(here)
    assert back.options == AWKWARD_JSON and back.workspace is None and back.result is None
    assert back.lease_expires_at == WHEN and back.pk == here.pk


def test_rows_inserted_here_read_back_through_the_orm() -> None:
    run = a_run()
    sql.create(run)
    messages = [(run.pk, i, "user", {"role": "user", "content": AWKWARD_JSON["text"], "i": i}, WHEN) for i in range(3)]
    sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), messages)
    sql.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "odd", AWKWARD_JSON, WHEN)])
    assert list(RunMessage.objects.filter(run=run).order_by("seq").values_list("seq", "data", "created_at")) == [
        (i, m[3], WHEN) for i, m in enumerate(messages)
    ]
    event = RunEvent.objects.get(run=run)
    assert (event.type, event.data, event.created_at) == ("odd", AWKWARD_JSON, WHEN)
    # ... and sql.values reads what the ORM reads.
    assert sql.values(RunMessage, "data", "seq", run_id=run.pk) == [m[3] for m in messages]
    assert sql.values(RunMessage, "data", "seq", run_id=str(run.pk)) == [m[3] for m in messages]


def test_json_values_that_are_not_objects_round_trip() -> None:
    run = a_run()
    sql.create(run)
    values = ["a string", 42, [1, "two"], True, {"null": None}]
    sql.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "v", v, WHEN) for v in values])
    assert list(RunEvent.objects.filter(run=run).order_by("id").values_list("data", flat=True)) == values


def test_an_update_here_is_a_compare_and_set_with_the_orm_values() -> None:
    run = a_run()
    run.save(force_insert=True)
    later = WHEN + timedelta(seconds=5)
    assert sql.update(AgentRun, {"id": run.pk, "status": RunStatus.QUEUED}, {"status": RunStatus.DONE}) == 0
    changed = sql.update(
        AgentRun, {"id": run.pk, "lease_owner": "tok-ü", "status": RunStatus.RUNNING},
        {"status": RunStatus.SUSPENDED, "lease_owner": None, "lease_expires_at": None, "updated_at": later,
         "usage": {"output_tokens": 9}, "workspace": AWKWARD_JSON, "result": "fertig ✓"},
    )
    assert changed == 1
    back = AgentRun.objects.get(pk=run.pk)
    assert (back.status, back.lease_owner, back.lease_expires_at, back.updated_at) == (
        RunStatus.SUSPENDED, None, None, later,
    )
    assert (back.usage, back.workspace, back.result) == ({"output_tokens": 9}, AWKWARD_JSON, "fertig ✓")
    # The ORM writing the same values stores the same bytes.
    twin = a_run(created_by=run.created_by)
    twin.save(force_insert=True)
    AgentRun.objects.filter(pk=twin.pk).update(
        status=RunStatus.SUSPENDED, lease_owner=None, lease_expires_at=None, updated_at=later,
        usage={"output_tokens": 9}, workspace=AWKWARD_JSON, result="fertig ✓", created_at=back.created_at,
    )
    sql.update(AgentRun, {"id": run.pk}, {"created_at": back.created_at})
    assert stored(AgentRun, run.pk) == stored(AgentRun, twin.pk)


def test_get_and_refresh_read_what_the_orm_reads() -> None:
    run = a_run()
    run.save(force_insert=True)
    orm = AgentRun.objects.get(pk=run.pk)
    for key in (run.pk, str(run.pk)):
        got = sql.get(AgentRun, id=key, status=RunStatus.RUNNING)
        assert got is not None and fields(got) == fields(orm)
        assert not got._state.adding and got._state.db == "default"
    assert sql.get(AgentRun, id=run.pk, status=RunStatus.QUEUED) is None
    with transaction.atomic():
        locked = sql.get(AgentRun, id=run.pk, for_update=True)
    assert locked is not None and fields(locked) == fields(orm)
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.DONE, finished_at=WHEN, workspace=[1])
    stale = AgentRun.objects.get(pk=run.pk)
    assert stale.created_by is not None  # cached now
    AgentRun.objects.filter(pk=run.pk).update(created_by=None, result="ok")
    sql.refresh(stale)
    assert (stale.status, stale.finished_at, stale.workspace, stale.result) == (RunStatus.DONE, WHEN, [1], "ok")
    assert stale.created_by is None  # the cached user is dropped, as refresh_from_db drops it


def test_calls_with_decisions_reads_what_select_related_reads() -> None:
    run = a_run()
    run.save(force_insert=True)
    decided = ToolCall.objects.create(
        run=run, tool_call_id="c1", name="write", capability="write", args=AWKWARD_JSON, digest="d" * 64,
        status=CallStatus.APPROVED, result=None,
    )
    Decision.objects.create(tool_call=decided, verdict=Verdict.APPROVED, note="ok ✓", args={"path": "ä"},
                            digest="d" * 64, decided_by=run.created_by, source="admin")
    ToolCall.objects.create(
        run=run, tool_call_id="c2", name="shell", capability="shell", args={}, digest="e" * 64,
        status=CallStatus.PENDING_APPROVAL, idempotent=True, result={"error": "x"},
    )
    orm = {c.tool_call_id: c for c in ToolCall.objects.filter(run=run).select_related("decision")}
    ours = {c.tool_call_id: c for c in sql.calls_with_decisions(run.pk, ["c1", "c2", "absent"])}
    assert sorted(ours) == ["c1", "c2"]
    for key, call in ours.items():
        assert fields(call) == fields(orm[key])
    assert fields(ours["c1"].decision) == fields(orm["c1"].decision)
    assert ours["c1"].decision.tool_call is ours["c1"]
    with pytest.raises(ToolCall.decision.RelatedObjectDoesNotExist):
        ours["c2"].decision  # noqa: B018 - cached as absent: no query, the ORM's error
    assert sql.calls_with_decisions(run.pk, []) == []


def test_bulk_create_sets_keys_and_create_writes_decisions_like_the_orm() -> None:
    run = a_run()
    run.save(force_insert=True)
    calls = [
        ToolCall(run_id=run.pk, agent=run.agent, tool_call_id=f"c{i}", name="write", capability="write",
                 args={"i": i, "s": "ü"}, digest=str(i) * 64, status=CallStatus.PENDING_APPROVAL)
        for i in range(3)
    ]
    sql.bulk_create(calls)
    assert all(c.pk is not None and not c._state.adding for c in calls)
    assert [fields(c) for c in calls] == [fields(ToolCall.objects.get(pk=c.pk)) for c in calls]
    decision = sql.create(Decision(tool_call=calls[0], verdict=Verdict.DENIED, note="nein", args=None,
                                   digest=calls[0].digest, decided_by=None, source="api"))
    back = Decision.objects.get(pk=decision.pk)
    assert fields(back) == fields(decision)
    assert back.args is None and back.decided_at is not None and back.decided_at.tzinfo is not None
    twin = Decision.objects.create(tool_call=calls[1], verdict=Verdict.DENIED, note="nein", args=None,
                                   digest=calls[0].digest, decided_by=None, source="api")
    ours, theirs = stored(Decision, decision.pk), stored(Decision, twin.pk)
    columns = [f.column for f in Decision._meta.concrete_fields if not f.primary_key]
    skip = {columns.index("tool_call_id"), columns.index("decided_at")}
    assert [v for i, v in enumerate(ours) if i not in skip] == [v for i, v in enumerate(theirs) if i not in skip]


def test_create_leaves_a_listened_model_to_the_orm_so_receivers_run() -> None:
    run = a_run()
    run.save(force_insert=True)
    seen: list[tuple[Any, bool]] = []

    def receiver(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
        seen.append((instance, created))

    post_save.connect(receiver, sender=RunEvent)
    try:
        event = sql.create(RunEvent(run=run, type="heard", data={}))
    finally:
        post_save.disconnect(receiver, sender=RunEvent)
    assert seen == [(event, True)]
    sql.create(RunEvent(run=run, type="unheard", data={}))
    assert len(seen) == 1


#: the pending status bound as a value, and written into the statement as a literal (durable.fixed)
BOUND_OR_FIXED = pytest.mark.parametrize("pending", [CallStatus.PENDING_APPROVAL, PENDING_APPROVAL],
                                         ids=["bound", "fixed"])


@BOUND_OR_FIXED
def test_requeue_bumps_the_generation_only_when_no_call_is_pending(pending: str) -> None:
    run = a_run(status=RunStatus.SUSPENDED)
    run.save(force_insert=True)
    call = ToolCall.objects.create(run=run, tool_call_id="c", name="write", capability="write", args={},
                                   digest="d" * 64, status=CallStatus.PENDING_APPROVAL)
    assert sql.requeue(run.pk, RunStatus.SUSPENDED, RunStatus.QUEUED, WHEN, unless_pending=pending) == 0
    ToolCall.objects.filter(pk=call.pk).update(status=CallStatus.APPROVED)
    assert sql.requeue(run.pk, RunStatus.RUNNING, RunStatus.QUEUED, WHEN, unless_pending=pending) == 0
    assert sql.requeue(run.pk, RunStatus.SUSPENDED, RunStatus.QUEUED, WHEN, unless_pending=pending) == 1
    back = AgentRun.objects.get(pk=run.pk)
    assert (back.status, back.generation, back.lease_owner, back.updated_at) == (RunStatus.QUEUED, 8, None, WHEN)
    assert sql.requeue(run.pk, RunStatus.QUEUED, RunStatus.QUEUED, WHEN) == 1
    assert AgentRun.objects.get(pk=run.pk).generation == 9


def test_a_failed_statement_marks_the_atomic_block_for_rollback() -> None:
    run = a_run()
    run.save(force_insert=True)
    rows = [(run.pk, 0, "user", {}, WHEN)]
    sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), rows)
    with transaction.atomic():
        with pytest.raises(Exception, match="(?i)unique"):
            sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), rows)
        assert transaction.get_connection().needs_rollback  # the block ends in a rollback
    assert RunMessage.objects.filter(run=run).count() == 1


# --- the fast paths of the reads every approval makes ---------------------------------------------


def pending_run(n: int) -> tuple[AgentRun, list[ToolCall]]:
    run = a_run(status=RunStatus.SUSPENDED)
    run.save(force_insert=True)
    calls = []
    for i in range(n):
        calls.append(ToolCall.objects.create(
            run=run, tool_call_id=f"c{i}", name="write", capability="write", args={"i": i, **AWKWARD_JSON},
            digest="d" * 64, status=CallStatus.PENDING_APPROVAL,
        ))
    # Noise the fast path must not return: another run's pending call, and a decided call.
    other = a_run(status=RunStatus.SUSPENDED)
    other.save(force_insert=True)
    ToolCall.objects.create(run=other, tool_call_id="c0", name="write", capability="write", args={},
                            digest="e" * 64, status=CallStatus.PENDING_APPROVAL)
    ToolCall.objects.create(run=run, tool_call_id="done", name="read", capability="read", args={},
                            digest="f" * 64, status=CallStatus.SUCCEEDED)
    return run, calls


def orm_pending(run: AgentRun) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run=run, status=CallStatus.PENDING_APPROVAL).order_by("created_at", "id"))


def test_pending_calls_get_is_one_statement_and_reads_what_the_orm_reads() -> None:
    run, _ = pending_run(1)
    with CaptureQueriesContext(connection) as queries:
        call = run.pending_calls().get()
        assert call.run is run  # the run is known: no query for it
    assert len(queries) == 1
    assert fields(call) == fields(orm_pending(run)[0])
    assert not call._state.adding and call._state.db == "default"


def test_pending_calls_get_raises_what_the_orm_raises() -> None:
    run, _ = pending_run(0)
    with pytest.raises(ToolCall.DoesNotExist, match="matching query does not exist"):
        run.pending_calls().get()
    run, _ = pending_run(2)
    with pytest.raises(ToolCall.MultipleObjectsReturned, match="it returned 2!"):
        run.pending_calls().get()
    run, _ = pending_run(22)
    with pytest.raises(ToolCall.MultipleObjectsReturned, match="more than 20"):
        run.pending_calls().get()
    with pytest.raises(ValueError, match="needs to have a value"):
        AgentRun(pk=None).pending_calls()


def test_pending_calls_iterated_or_changed_are_the_orms() -> None:
    run, calls = pending_run(3)
    listed = list(run.pending_calls())
    assert [fields(c) for c in listed] == [fields(c) for c in orm_pending(run)]
    assert [c.pk for c in listed] == [c.pk for c in calls]
    # Anything chained is a new queryset, built by the ORM, with the run's filter in it.
    assert run.pending_calls().filter(tool_call_id="c1").get().pk == calls[1].pk
    assert run.pending_calls().get(tool_call_id="c2").pk == calls[2].pk
    assert list(run.pending_calls().order_by("-id").values_list("tool_call_id", flat=True)) == ["c2", "c1", "c0"]
    assert run.pending_calls().count() == 3 and run.pending_calls().exists()
    assert run.pending_calls().first().pk == calls[0].pk  # type: ignore[union-attr]
    ToolCall.objects.filter(pk=calls[0].pk).update(status=CallStatus.APPROVED)
    assert [c.pk for c in run.pending_calls()] == [c.pk for c in calls[1:]]
    assert "run_id" in str(run.pending_calls().query) and run.pk.hex in str(run.pending_calls().query).replace("-", "")


def test_refresh_from_db_fast_path_and_the_orms_agree() -> None:
    run, calls = pending_run(1)
    stale_fast, stale_orm = AgentRun.objects.get(pk=run.pk), AgentRun.objects.get(pk=run.pk)
    for stale in (stale_fast, stale_orm):
        assert stale.created_by is not None  # cached now
        list(stale.tool_calls.all())
    AgentRun.objects.filter(pk=run.pk).update(created_by=None, status=RunStatus.DONE, finished_at=WHEN, result="ok")
    stale_fast.refresh_from_db()
    models_refresh = Model.refresh_from_db
    models_refresh(stale_orm)
    assert fields(stale_fast) == fields(stale_orm)
    assert stale_fast.created_by is None and stale_fast.status == RunStatus.DONE
    # Only the ORM's arguments take the ORM's path, and keep their meaning.
    AgentRun.objects.filter(pk=run.pk).update(result="again", error="e")
    stale_fast.refresh_from_db(fields=["result"])
    assert (stale_fast.result, stale_fast.error) == ("again", "")
    deferred = AgentRun.objects.only("id", "status").get(pk=run.pk)
    deferred.refresh_from_db()
    assert deferred.get_deferred_fields() == {f.attname for f in AgentRun._meta.concrete_fields} - {"id", "status"}
    call = calls[0]
    ToolCall.objects.filter(pk=call.pk).update(status=CallStatus.SUCCEEDED, result={"ok": "ü"})
    call.refresh_from_db()
    assert (call.status, call.result) == (CallStatus.SUCCEEDED, {"ok": "ü"})
    AgentRun.objects.filter(pk=run.pk).delete()
    with pytest.raises(AgentRun.DoesNotExist):
        stale_fast.refresh_from_db()


# --- Batch: one write transaction, one statement on PostgreSQL ---------------------------------------


def run_rows(run: AgentRun) -> tuple[list[Any], list[Any], list[Any]]:
    return (
        [stored(RunMessage, pk) for pk in RunMessage.objects.filter(run=run).order_by("seq").values_list("pk", flat=True)],
        [stored(RunEvent, pk) for pk in RunEvent.objects.filter(run=run).order_by("pk").values_list("pk", flat=True)],
        [stored(ToolCall, pk) for pk in ToolCall.objects.filter(run=run).order_by("pk").values_list("pk", flat=True)],
    )


def a_batch(run: AgentRun, where: dict[str, Any], *, sequential: bool = False) -> tuple[sql.Batch, list[ToolCall]]:
    batch = sql.Batch()
    if sequential:
        batch._combined = False
    batch.gate(AgentRun, where, {"lease_expires_at": WHEN, "workspace": AWKWARD_JSON})
    batch.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"),
                 [(run.pk, i, "user", {"i": i, **AWKWARD_JSON}, WHEN) for i in range(3)])
    batch.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "x", AWKWARD_JSON, WHEN)])
    calls = [ToolCall(run_id=run.pk, tool_call_id=f"b{i}", name="write", capability="write", args={"n": i},
                      digest="d" * 64, status=CallStatus.PENDING_APPROVAL) for i in range(3)]
    batch.create(calls)
    return batch, calls


def test_a_batch_writes_the_rows_of_its_steps_one_by_one_alike() -> None:
    """On PostgreSQL one statement; the same rows as the steps one by one in a transaction."""
    written = []
    for sequential in (False, True):
        run = a_run()
        run.save(force_insert=True)
        batch, calls = a_batch(run, {"id": run.pk, "lease_owner": "tok-ü", "status": RunStatus.RUNNING},
                               sequential=sequential)
        with CaptureQueriesContext(connection) as queries:
            assert batch.run() is True
        if connection.vendor == "postgresql" and not sequential:
            assert [q["sql"].split()[0] for q in queries.captured_queries] == ["WITH"]
        assert batch.counts == [1, 3, 1, 3]
        # The keys of the created rows are set, each on its own object, in order.
        assert [c.tool_call_id for c in ToolCall.objects.filter(pk__in=[c.pk for c in calls]).order_by("pk")] == [
            "b0", "b1", "b2"]
        assert [ToolCall.objects.get(pk=c.pk).tool_call_id for c in calls] == ["b0", "b1", "b2"]
        assert all(not c._state.adding and c._state.db == "default" for c in calls)
        got = AgentRun.objects.get(pk=run.pk)
        assert (got.lease_expires_at, got.workspace) == (WHEN, AWKWARD_JSON)
        messages, events, tool_calls = run_rows(run)
        # Rows compared without the run's key and the calls' own creation times.
        written.append((len(messages), [m[1:] for m in messages], [e[1:] for e in events],
                        [c[1:8] for c in tool_calls]))
    assert written[0] == written[1]
    assert ToolCall.objects.get(pk=calls[0].pk).args == {"n": 0}


def test_a_batch_whose_gate_does_not_match_writes_nothing() -> None:
    for sequential in (False, True):
        run = a_run()
        run.save(force_insert=True)
        batch, calls = a_batch(run, {"id": run.pk, "lease_owner": "someone else", "status": RunStatus.RUNNING},
                               sequential=sequential)
        assert batch.run() is False
        assert run_rows(run) == ([], [], [])
        assert AgentRun.objects.get(pk=run.pk).workspace is None
        assert all(c.pk is None for c in calls)


def test_a_failing_step_of_a_batch_writes_nothing_and_an_overlong_value_is_refused_not_cut() -> None:
    from django.db import DataError, IntegrityError

    run = a_run()
    run.save(force_insert=True)
    RunMessage.objects.create(run=run, seq=1, role="user", data={})
    for sequential in (False, True):
        batch, _ = a_batch(run, {"id": run.pk, "status": RunStatus.RUNNING}, sequential=sequential)
        with pytest.raises(IntegrityError):  # seq 1 is taken
            batch.run()
        assert AgentRun.objects.get(pk=run.pk).workspace is None
        assert RunMessage.objects.filter(run=run).count() == 1 and not RunEvent.objects.filter(run=run).exists()
    if connection.vendor == "postgresql":  # SQLite does not check lengths
        batch = sql.Batch()
        batch.gate(AgentRun, {"id": run.pk}, {"error": "e"})
        batch.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), [(run.pk, 7, "r" * 17, {}, WHEN)])
        with pytest.raises(DataError):
            batch.run()
        assert not RunMessage.objects.filter(run=run, seq=7).exists()


@BOUND_OR_FIXED
def test_a_batch_requeue_does_not_count_the_call_decided_in_it(pending: str) -> None:
    """The batch's decision: the call's compare-and-set, then the wake-up that must not see that
    call as still pending (one statement on PostgreSQL: one snapshot), but must see the others."""
    run = a_run(status=RunStatus.SUSPENDED)
    run.save(force_insert=True)
    first, second = (ToolCall.objects.create(run=run, tool_call_id=f"c{i}", name="write", capability="write",
                                             args={}, digest="d" * 64, status=CallStatus.PENDING_APPROVAL)
                     for i in range(2))
    for call, woken in ((first, 0), (second, 1)):
        batch = sql.Batch()
        batch.gate(ToolCall, {"id": call.pk, "status": pending}, {"status": CallStatus.APPROVED})
        i = batch.requeue(run.pk, RunStatus.SUSPENDED, RunStatus.QUEUED, WHEN, unless_pending=pending, besides=call.pk)
        assert batch.run() is True
        assert batch.counts[i] == woken
    back = AgentRun.objects.get(pk=run.pk)
    assert (back.status, back.generation) == (RunStatus.QUEUED, 8)


def test_a_batch_with_a_listened_model_runs_its_steps_one_by_one_so_receivers_run() -> None:
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance.tool_call_id)

    run = a_run()
    run.save(force_insert=True)
    post_save.connect(receiver, sender=ToolCall)
    try:
        batch, calls = a_batch(run, {"id": run.pk, "status": RunStatus.RUNNING})
        assert batch.run() is True
    finally:
        post_save.disconnect(receiver, sender=ToolCall)
    assert seen == ["b0", "b1", "b2"] and all(c.pk for c in calls)


def test_each_fields_fast_preparation_is_get_db_prep_save() -> None:
    def comparable(value: Any) -> Any:
        return ("json", value.obj) if type(value).__name__ == "Jsonb" else (type(value), value)

    key = uuid.uuid4()
    samples = ["text", "", True, False, 7, None, WHEN, WHEN.replace(tzinfo=None), AWKWARD_JSON, [1, "2"],
               key, str(key), 1.5]  # fmt: skip
    checked = 0
    for model in (AgentRun, RunMessage, RunEvent, ToolCall, Decision):
        for field in model._meta.concrete_fields:
            for value in samples:
                try:
                    expected = field.get_db_prep_save(value, connection)
                except Exception as exc:  # noqa: BLE001 - the fast path must fail alike
                    with pytest.raises(type(exc)):
                        savers.saver(field)(value, connection)
                    continue
                assert comparable(savers.saver(field)(value, connection)) == comparable(expected), (field, value)
                checked += 1
    assert checked > 300


def test_run_and_messages_reads_what_get_and_values_read() -> None:
    run = a_run(status=RunStatus.QUEUED)
    run.save(force_insert=True)
    assert sql.run_and_messages(run.pk, RunStatus.QUEUED)[1] == []
    for seq in (2, 0, 1):  # stored out of order, read in order
        RunMessage.objects.create(run=run, seq=seq, role="user", data={"seq": seq, **AWKWARD_JSON})
    other = a_run(status=RunStatus.QUEUED)
    other.save(force_insert=True)
    RunMessage.objects.create(run=other, seq=0, role="user", data={"other": True})
    got, messages = sql.run_and_messages(run.pk, RunStatus.QUEUED)
    assert got is not None and fields(got) == fields(AgentRun.objects.get(pk=run.pk))
    assert messages == sql.values(RunMessage, "data", "seq", run_id=run.pk)
    assert messages == [m.data for m in RunMessage.objects.filter(run=run).order_by("seq")]
    assert [m["seq"] for m in messages] == [0, 1, 2]
    assert sql.run_and_messages(run.pk, RunStatus.RUNNING) == (None, [])
    assert sql.run_and_messages(uuid.uuid4(), RunStatus.QUEUED) == (None, [])


def test_a_batch_too_big_for_one_statement_runs_step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sql, "COMBINED_MAX_PARAMS", 10)
    run = a_run()
    run.save(force_insert=True)
    batch, calls = a_batch(run, {"id": run.pk, "status": RunStatus.RUNNING})
    with CaptureQueriesContext(connection) as queries:
        assert batch.run() is True
    assert not [q for q in queries.captured_queries if q["sql"].startswith("WITH")]
    assert batch.counts == [1, 3, 1, 3] and all(c.pk for c in calls)
    assert RunMessage.objects.filter(run=run).count() == 3


def commit_level() -> str:
    """How this connection's current transaction will commit: ``wait`` for the disk or not."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW synchronous_commit")
            return "wait" if cursor.fetchone()[0] != "off" else "no wait"
        cursor.execute("PRAGMA synchronous")
        return "wait" if cursor.fetchone()[0] >= sql.SQLITE_FULL else "no wait"


@pytest.fixture
def commits_wait() -> Any:
    """Commits that wait for the disk, as in production (the test server's are set not to)."""
    if connection.vendor != "postgresql":
        assert commit_level() == "wait"  # tests/settings.py: WAL, synchronous=FULL
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")


@pytest.mark.usefixtures("commits_wait")
def test_a_batch_that_need_not_wait_commits_without_the_wait_for_its_own_transaction_alone() -> None:
    run = a_run()
    run.save(force_insert=True)
    seen: list[str] = []
    for durable in (True, False):
        batch = sql.Batch(durable=durable)
        batch.gate(AgentRun, {"id": run.pk}, {"error": f"durable={durable}"})
        batch.call(lambda: seen.append(commit_level()))  # inside the transaction
        assert batch.run() is True
        seen.append(commit_level())  # after it: the connection's own level again
    assert seen == ["wait", "wait", "no wait", "wait"]
    assert AgentRun.objects.get(pk=run.pk).error == "durable=False"
    # Inside the caller's transaction the setting would hold for the caller's writes too: none.
    with transaction.atomic():
        batch = sql.Batch(durable=False)
        batch.gate(AgentRun, {"id": run.pk}, {"error": "inside"})
        batch.call(lambda: seen.append(commit_level()))
        assert batch.run() is True
    assert seen[-1] == "wait"
    # A failing batch leaves the connection's level as it was.
    batch = sql.Batch(durable=False)
    batch.gate(AgentRun, {"id": run.pk}, {"error": "fails"})
    batch.call(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        batch.run()
    assert commit_level() == "wait" and AgentRun.objects.get(pk=run.pk).error == "inside"


@pytest.mark.usefixtures("commits_wait")
def test_how_a_commit_is_told_not_to_wait_on_this_database(tmp_path: Any) -> None:
    """PostgreSQL: the batch's one statement sets ``synchronous_commit`` off for its own
    transaction (and only a batch that need not wait). SQLite: ``synchronous=NORMAL`` around the
    transaction in WAL mode only: with a rollback journal a commit that did not wait could
    corrupt the file on power loss, so there the batch commits as usual."""
    if connection.vendor == "postgresql":
        for durable in (True, False):
            run = a_run()
            run.save(force_insert=True)
            batch, _ = a_batch(run, {"id": run.pk, "status": RunStatus.RUNNING})
            batch.durable = durable
            with CaptureQueriesContext(connection) as queries:
                assert batch.run() is True
            [statement] = [q["sql"] for q in queries.captured_queries]
            assert statement.startswith("WITH")
            assert ("set_config('synchronous_commit', 'off', true)" in statement) is not durable
            assert batch.counts == [1, 3, 1, 3]
            assert commit_level() == "wait"  # the setting held for that statement's transaction alone
        return
    import sqlite3

    raw = sqlite3.connect(tmp_path / "rollback.sqlite3")
    raw.execute("PRAGMA synchronous=FULL")

    class Conn:
        connection = raw

        def ensure_connection(self) -> None:
            pass

    with sql._sqlite_no_wait(Conn()):  # type: ignore[arg-type]
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == sql.SQLITE_FULL
    raw.execute("PRAGMA journal_mode=WAL")
    with sql._sqlite_no_wait(Conn()):  # type: ignore[arg-type]
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == sql.SQLITE_NORMAL
    assert raw.execute("PRAGMA synchronous").fetchone()[0] == sql.SQLITE_FULL
    raw.close()


def test_a_fixed_value_is_a_literal_of_the_statement_and_compares_as_a_bound_one() -> None:
    run = a_run(status=RunStatus.SUSPENDED)
    run.save(force_insert=True)
    calls = [ToolCall.objects.create(run=run, tool_call_id=f"c{i}", name="write", capability="write", args={},
                                     digest="d" * 64, status=status)
             for i, status in enumerate([CallStatus.PENDING_APPROVAL, CallStatus.APPROVED, CallStatus.PENDING_APPROVAL])]
    sent: list[tuple[str, Any]] = []

    def watch(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((text, params))
        return execute(text, params, many, context)

    with connection.execute_wrapper(watch):
        fixed = sql.select(ToolCall, order_by=("id",), run=run.pk, status=PENDING_APPROVAL)
    [(text, params)] = sent
    assert "= 'pending_approval'" in text and len(params) == 1  # the run's id alone is bound
    bound = sql.select(ToolCall, order_by=("id",), run=run.pk, status=CallStatus.PENDING_APPROVAL)
    assert [c.pk for c in fixed] == [c.pk for c in bound] == [calls[0].pk, calls[2].pk]
    assert sql.update(ToolCall, {"id": calls[1].pk, "status": PENDING_APPROVAL}, {"status": CallStatus.DENIED}) == 0
    assert sql.update(ToolCall, {"id": calls[2].pk, "status": PENDING_APPROVAL}, {"status": CallStatus.DENIED}) == 1
    assert list(ToolCall.objects.order_by("id").values_list("status", flat=True)) == ["pending_approval", "approved", "denied"]


@pytest.mark.parametrize("value", ["pending'; DROP TABLE x; --", "Pending", "", "a" * 65, "pending approval"])
def test_a_fixed_value_is_a_word_or_refused(value: str) -> None:
    with pytest.raises(ValueError, match="lowercase letters and underscores"):
        Fixed(value)

