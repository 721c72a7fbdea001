"""nexo_django.durable.driver: the durable layer's statements straight to the driver keep what
Django's cursor, ``atomic`` and ``Model.__init__`` guarantee (issue 34)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from nexo_django.durable import sql
from nexo_django.models import AgentRun, RunEvent, RunMessage, RunStatus
from tests.durable.test_sql import WHEN, a_run, fields

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_statements_sent_straight_to_the_driver_keep_djangos_checks_and_errors() -> None:
    """With nothing watching the connection, statements skip Django's cursor (issue 34): its
    checks stay (a broken transaction, an async context) and errors are Django's, not the driver's."""
    from django.core.exceptions import SynchronousOnlyOperation
    from django.db import IntegrityError
    from django.db.transaction import TransactionManagementError

    assert not connection.execute_wrappers and not connection.queries_logged  # the path tested
    run = a_run()
    run.save(force_insert=True)
    rows = [(run.pk, 0, "user", {}, WHEN)]
    sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), rows)
    with pytest.raises(IntegrityError):  # django.db's, whatever the driver raised
        sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), rows)
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), rows)
        with pytest.raises(TransactionManagementError):
            sql.get(AgentRun, id=run.pk)  # as the ORM: nothing more until the block ends

    async def from_the_event_loop() -> None:
        sql.get(AgentRun, id=run.pk)

    import asyncio

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(from_the_event_loop())
    assert sql.get(AgentRun, id=run.pk) is not None


def test_a_batch_of_its_own_rolls_back_whole_when_a_step_fails() -> None:
    """A batch outside any transaction is one (on SQLite begun and ended on the driver's connection,
    issue 34): a failing step leaves none of its rows, the connection usable after it."""
    from django.db import IntegrityError

    run = a_run(status=RunStatus.QUEUED)
    run.save(force_insert=True)
    sql.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), [(run.pk, 1, "user", {}, WHEN)])
    batch = sql.Batch()
    batch.gate(AgentRun, {"id": run.pk, "status": RunStatus.QUEUED}, {"error": "changed"})
    batch.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "x", {}, WHEN)])
    batch.insert(RunMessage, ("run_id", "seq", "role", "data", "created_at"), [(run.pk, 1, "user", {}, WHEN)])
    with pytest.raises(IntegrityError):
        batch.run()
    assert AgentRun.objects.get(pk=run.pk).error == ""
    assert not RunEvent.objects.filter(run=run).exists()
    assert connection.get_autocommit() and not connection.in_atomic_block
    batch = sql.Batch()
    batch.gate(AgentRun, {"id": run.pk, "status": RunStatus.QUEUED}, {"error": "changed"})
    batch.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "x", {}, WHEN)])
    assert batch.run()
    assert AgentRun.objects.get(pk=run.pk).error == "changed" and RunEvent.objects.filter(run=run).count() == 1


def test_rows_read_here_are_instances_the_orm_would_build_and_post_init_still_runs() -> None:
    """A row read here becomes an instance without ``Model.__init__``'s loop (issue 34): the same
    attributes and state as the ORM's; with a ``post_init`` receiver, the ORM's way, so it runs."""
    from django.db.models.signals import post_init

    run = a_run()
    run.save(force_insert=True)
    fast = sql.get(AgentRun, id=run.pk)
    orm = AgentRun.objects.get(pk=run.pk)
    assert fast is not None and fields(fast) == fields(orm)
    assert (fast._state.adding, fast._state.db) == (orm._state.adding, orm._state.db) == (False, "default")
    assert fast.created_by == orm.created_by  # the relation is read from the key, as the ORM's
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance.pk)

    post_init.connect(receiver, sender=AgentRun)
    try:
        assert sql.get(AgentRun, id=run.pk) is not None
    finally:
        post_init.disconnect(receiver, sender=AgentRun)
    assert seen == [run.pk]


def _comparable(obj: Any) -> dict[str, Any]:
    """Each concrete field's attribute as set (generated ones: whether set at all), the state."""
    seen = {f.attname: obj.__dict__.get(f.attname, "<unset>") for f in obj._meta.concrete_fields}
    return {**seen, "_state": (obj._state.adding, obj._state.db)}


def test_new_rows_are_the_instances_model_init_builds_and_its_errors_stay() -> None:
    """``driver.new`` builds a new row's instance without ``Model.__init__``'s loop (issue 34):
    the same attributes (defaults applied, a relation's object cached, generated fields unset) as
    ``Model(**kwargs)``; a name it does not know, a receiver of ``pre_init``/``post_init``: Django's
    own way, with its error."""
    from django.db.models.signals import pre_init

    from nexo_django.durable import driver
    from nexo_django.models import CallStatus, Decision, ToolCall

    run = a_run()
    run.save(force_insert=True)
    user = run.created_by
    cases: list[tuple[type[Any], dict[str, Any]]] = [
        (AgentRun, {"agent": "a.B", "prompt": "p", "status": RunStatus.QUEUED, "created_by": user,
                    "options": {"x": 1}, "generation": 1, "workspace": None}),
        (AgentRun, {"agent": "a.B", "prompt": "p", "created_by": None}),
        (ToolCall, {"run_id": run.pk, "agent": "a.B", "tool_call_id": "c1", "name": "write", "capability": "write",
                    "args": {"path": "a"}, "digest": "d", "status": CallStatus.PENDING_APPROVAL, "idempotent": False,
                    "expires_at": WHEN, "server": ""}),
        (ToolCall, {"run": run, "tool_call_id": "c2", "name": "read"}),
    ]
    for model, kwargs in cases:
        fast, slow = driver.new(model, **kwargs), model(**kwargs)
        # defaults drawn per instance (a new uuid, now): equal in kind, not in value
        for name in ("id", "created_at", "updated_at"):
            for obj in (fast, slow):
                if name in obj.__dict__ and name not in kwargs:
                    obj.__dict__[name] = type(obj.__dict__[name]).__name__
        assert _comparable(fast) == _comparable(slow), model
        if "run" in kwargs:
            assert ToolCall.run.is_cached(fast) and fast.run is run
    call = driver.new(ToolCall, run_id=run.pk, tool_call_id="c3", name="write")
    decision = driver.new(Decision, tool_call=call, verdict="approved", decided_by=user)
    assert decision.tool_call is call and decision.decided_by_id == user.pk
    with pytest.raises(ValueError, match="must be a"):  # the relation's descriptor checks the type
        driver.new(Decision, tool_call=run)
    with pytest.raises(TypeError, match="unexpected keyword"):
        driver.new(ToolCall, no_such_field=1)
    assert driver.new(ToolCall, args_size=3).args_size == ToolCall(args_size=3).args_size == 3  # Django's way
    seen: list[Any] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(dict(kwargs["kwargs"]))  # Model.__init__ empties it later

    pre_init.connect(receiver, sender=ToolCall)
    try:
        driver.new(ToolCall, tool_call_id="c4")
    finally:
        pre_init.disconnect(receiver, sender=ToolCall)
    assert seen == [{"tool_call_id": "c4"}]


def test_a_resume_reads_its_messages_in_seq_order_or_reads_them_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """On SQLite the run and its messages are one statement (issue 34), their texts joined in the
    order a subquery gives: that order is checked against the ``seq`` values, and should it not
    hold the messages are read apart, in order."""
    from nexo_django.durable import sql as module

    run = a_run(status=RunStatus.QUEUED)
    run.save(force_insert=True)
    for seq in (2, 0, 1):
        RunMessage.objects.create(run=run, seq=seq, role="user", data={"seq": seq, "text": "a,b"})
    got, messages = sql.run_and_messages(run.pk, RunStatus.QUEUED)
    assert got is not None and [m["seq"] for m in messages] == [0, 1, 2]
    if connection.vendor != "sqlite":
        return  # PostgreSQL orders inside json_agg: nothing to check
    key = ("sqlite", "run_and_messages")
    built, fields_ = module._statements[key]
    monkeypatch.setitem(module._statements, key, (built.replace("ORDER BY", "ORDER BY -1 *"), fields_))
    assert module._sqlite_run_and_messages(connection, "default", run.pk, RunStatus.QUEUED) is None  # out of order
    got, messages = sql.run_and_messages(run.pk, RunStatus.QUEUED)
    assert got is not None and [m["seq"] for m in messages] == [0, 1, 2]


def test_each_columns_quick_converter_is_the_orms_converters() -> None:
    """A column's values read here are converted by one function per column (issue 34): for every
    column of the hot path's models and raw values of every kind a driver hands back, the same
    value as the ORM's converters applied in turn."""
    import uuid as uuid_module
    from datetime import datetime

    from nexo_django.durable import driver
    from nexo_django.models import Decision, ToolCall
    from nexo_django.storable import TEXT_MARK

    key = uuid_module.uuid4()
    raw: list[Any] = [None, "", "text", TEXT_MARK + "%41", '{"a": [1, 2.5, null]}', "[1, 2]", "not json {", "\ufeff{}",
                      0, 1, 2, 1.5, key.hex, str(key), key, WHEN, WHEN.replace(tzinfo=None), datetime(2026, 1, 2, 3, 4, 5)]
    checked = 0
    for model in (AgentRun, RunMessage, RunEvent, ToolCall, Decision):
        for field in model._meta.concrete_fields:
            col = field.get_col(model._meta.db_table)
            converters = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if not converters:
                continue
            quick = driver.converter(connection, col, converters)
            for value in raw:
                try:
                    expected = value
                    for c in converters:
                        expected = c(expected, col, connection)
                except Exception as exc:  # noqa: BLE001 - the quick one must fail alike
                    with pytest.raises(type(exc)):
                        quick(value)
                    continue
                got = quick(value)
                assert (type(got), got) == (type(expected), expected), (field, value)
                if isinstance(expected, datetime):
                    assert got.tzinfo == expected.tzinfo
                checked += 1
    assert checked > 100


def test_a_refresh_stores_the_row_and_drops_every_cached_relation() -> None:
    """``sql.refresh`` stores a plain model's attributes as they are (issue 34) and drops what
    ``refresh_from_db`` drops: forward relations' and reverse one-to-one cached objects."""
    from nexo_django.models import CallStatus, Decision, ToolCall

    run = a_run()
    run.save(force_insert=True)
    call = ToolCall.objects.create(run=run, tool_call_id="c1", name="write", capability="write", args={},
                                   digest="d" * 64, status=CallStatus.APPROVED)
    Decision.objects.create(tool_call=call, verdict="approved", digest="d" * 64)
    (read,) = sql.calls_with_decisions(run.pk, ["c1"])
    assert read.run is not None and ToolCall.run.is_cached(read) and ToolCall.decision.related.is_cached(read)
    ToolCall.objects.filter(pk=call.pk).update(status=CallStatus.SUCCEEDED, result={"ok": 1})
    sql.refresh(read)
    assert not ToolCall.run.is_cached(read) and not ToolCall.decision.related.is_cached(read)
    assert fields(read) == fields(ToolCall.objects.get(pk=call.pk))



def test_values_are_stored_as_given_and_on_postgresql_go_apart_from_the_statement_unprepared() -> None:
    """The values a statement of the driver's stores are the values given (quotes, percent signs,
    backslashes). On PostgreSQL they are bound on the server (psycopg dumps them in C) even where
    the connection binds on the client, Django's default; never prepared unless the connection
    asks for it (``prepare_threshold``), so a transaction-mode pooler is fine. The type PostgreSQL
    gives a bare parameter shows the binding: a value inlined in the text is a literal
    (``integer``), a value bound apart has the type psycopg sent (``smallint``)."""
    from nexo_django.durable import driver

    text = "it's 100% 'quoted' \\ é %s"
    run = a_run()
    run.save(force_insert=True)
    postgres = connection.vendor == "postgresql"
    connection.ensure_connection()

    def prepared() -> int:  # statements prepared on this connection, as PostgreSQL lists them
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            return int(cursor.fetchone()[0])

    prepared_before = prepared() if postgres else 0
    for _ in range(6):  # past psycopg's default threshold (5)
        sql.insert(RunEvent, ("run_id", "type", "data", "created_at"), [(run.pk, "note", {"text": text}, WHEN)])
    assert [e.data["text"] for e in RunEvent.objects.filter(run=run, type="note")] == [text] * 6
    if postgres:
        assert driver.execute_driver(connection, "SELECT pg_typeof(%s)::text", [1], True) == [("smallint",)]
        # PostgreSQL's own placeholders, numbered once per statement; %% is %; any other placeholder
        # goes to psycopg's conversion (the backend's cursor), with the same result.
        assert driver.dollar("SELECT %s, '100%%', %s") == "SELECT $1, '100%', $2"
        assert driver.dollar("SELECT %(a)s") == ""
        assert driver.execute_driver(connection, "SELECT %s || '%%' || %s", ["a", "b"], True) == [("a%b",)]
        assert driver.execute_driver(connection, "SELECT %(a)s::text", {"a": "x"}, True) == [("x",)]
        options = connection.settings_dict["OPTIONS"]
        asks = options.get("server_side_binding") is True and options.get("prepare_threshold") is not None
        assert (prepared() > prepared_before) == asks


def test_a_statement_past_psycopgs_cache_writes_what_djangos_cursor_writes() -> None:
    """A statement of more than 50 parameters (past psycopg's cache of its split at placeholders;
    on PostgreSQL the driver sends it in ``$n`` placeholders on a ``RawCursor``, issue 34) writes
    the rows Django's cursor writes: the same statement, the same rows."""
    from tests.durable.test_sql import AWKWARD_JSON

    run = a_run()
    run.save(force_insert=True)
    columns = ("run_id", "type", "data", "created_at")
    datas = [AWKWARD_JSON, {"quote": "it's \\'; DROP TABLE x; --", "nul": "a\x00b"}, {"n": [1.5, -0.0, 2**63]}, {}]
    rows = [(run.pk, f"t{i}'\"", datas[i % len(datas)], WHEN) for i in range(13)]  # 52 values
    assert len(rows) * len(columns) > 50

    sql.insert(RunEvent, columns, rows)  # straight to the driver
    with connection.execute_wrapper(lambda execute, *args: execute(*args)):  # through Django's cursor
        sql.insert(RunEvent, columns, rows)
    stored = [(e.type, e.data, e.created_at) for e in RunEvent.objects.filter(run=run).order_by("id")]
    assert stored[:13] == stored[13:] == [(r[1], r[2], WHEN) for r in rows]

