"""The hot path's statements as prepared SQL: claim, fence, mark, result, close, decide, wake.

Why this exists: the ORM builds and compiles every statement anew (a ``Query``, its lookups, its
compiler, its converters). Measured on SQLite, a compare-and-set ``filter().update()`` cost
0.18 ms of CPU and a ``filter().first()`` 0.46 ms, against 0.03 and 0.07 ms here; the approval
cycle runs about twenty such statements, and most of its CPU went to building them (issue 13).
Here each statement's SQL is built once per database vendor from the models' ``_meta`` (table and
column names, quoted by the backend) and run with ``cursor.execute(sql, params)`` on Django's
cursor (so execute wrappers, query logging and ``CaptureQueriesContext`` still see every one).
The statements and their semantics are the ORM's: compare-and-sets are ``UPDATE ... WHERE`` with
the row count checked by the caller, the lease fence is part of the same ``WHERE``.

The rows are the ORM's: values go in through the fields' own ``get_db_prep_save`` /
``get_db_prep_value`` (JSON with the field's encoder, datetimes, UUIDs as the backend stores
them) and come back through the converters the ORM applies (``ops.get_db_converters`` and the
field's ``from_db_value``). ``tests/durable/test_sql.py`` reads back through the ORM what is written here.

On PostgreSQL, :class:`Batch` sends each write transaction of the hot path as one statement (a
data-modifying ``WITH``: the compare-and-set first, every other write conditioned on it), so a
commit costs one round trip instead of one per statement plus ``BEGIN`` and ``COMMIT``.

The ORM stays for the admin and rare paths, and for :func:`create` whenever a ``pre_save`` or
``post_save`` receiver listens to the model (those signals come from ``Model.save()`` only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import AutoField, Field, Model
from django.db.models.signals import post_save, pre_save

from ..models import AgentRun, Decision, RunMessage, ToolCall
from ..storable import (
    StoredJSONDecoder,
    loads,
)
from . import driver, savers
from .fixed import Fixed
from .fixed import values as _fixed

#: built statements: (vendor, what, model, ...) -> (sql, fields)
_statements: dict[tuple[Any, ...], tuple[str, tuple[Field[Any, Any], ...]]] = {}
#: (vendor, model, field names or None for all) -> (index, converter) of each column with converters
_readers: dict[tuple[Any, ...], list[tuple[int, Callable[[Any], Any]]]] = {}

#: a batch with more values than this runs step by step (a server-side binding connection allows
#: 65535 parameters in one statement; client-side binding, Django's default, has no such limit)
COMBINED_MAX_PARAMS = 20000
#: batch statements built once and kept, at most (each shape of rows per step is one statement)
MAX_BATCH_SHAPES = 512
_batch_shapes: set[tuple[Any, ...]] = set()

#: SQLite's ``PRAGMA synchronous`` levels
SQLITE_NORMAL, SQLITE_FULL = 1, 2

#: rows per INSERT: under every backend's limit of bound parameters (SQLite's was 999)
BATCH_PARAMS = 900


def _db(model: type[Model], *, write: bool) -> tuple[str, BaseDatabaseWrapper]:
    if not router.routers:  # no DATABASE_ROUTERS: what the router would answer
        return DEFAULT_DB_ALIAS, connections[DEFAULT_DB_ALIAS]
    alias = router.db_for_write(model) if write else router.db_for_read(model)
    return alias, connections[alias]


#: a step's database, known already (``(alias, connection)``), or None: the router's
DB = tuple[str, BaseDatabaseWrapper] | None


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    return cast("Field[Any, Any]", model._meta.get_field(name))


def _execute(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any], fetch: bool = False) -> Any:
    """Run one statement; rows (``fetch``) or the row count. An error marks the enclosing atomic
    block for rollback, as the ORM's statements do (``transaction.mark_for_rollback_on_error``).
    Inside :meth:`Batch.run` the statements share one cursor. When nothing watches the
    connection's statements (no execute wrapper, no query logging: ``CaptureQueriesContext`` and
    ``DEBUG`` turn it on), a statement on SQLite or PostgreSQL goes straight to the driver's cursor
    (:mod:`.driver`): about 0.5 ms of CPU less per approval cycle on SQLite (issue 34), with the
    same checks made and errors wrapped the same way."""
    raw = driver.in_transaction(conn)
    if raw is not None:  # a plain batch's own transaction on SQLite: its checks are made
        return driver.execute_raw(raw, sql, params, fetch)
    if not conn.execute_wrappers and not conn.queries_logged:
        if conn.vendor == "sqlite":
            return driver.execute_sqlite(conn, sql, params, fetch)
        if conn.vendor == "postgresql" and getattr(conn, "_nexo_cursor", None) is None:
            return driver.execute_driver(conn, sql, params, fetch)
    try:
        cursor = getattr(conn, "_nexo_cursor", None)
        if cursor is not None:
            cursor.execute(sql, params)
            return cursor.fetchall() if fetch else cursor.rowcount
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if fetch else cursor.rowcount
    except Exception as exc:
        driver.doom(conn, exc)
        raise


def _table(conn: BaseDatabaseWrapper, model: type[Model]) -> str:
    return conn.ops.quote_name(model._meta.db_table)


def _column(conn: BaseDatabaseWrapper, model: type[Model], field: Field[Any, Any]) -> str:
    """``"table"."column"``"""
    return f"{_table(conn, model)}.{conn.ops.quote_name(str(field.column))}"


def _where(
    conn: BaseDatabaseWrapper, model: type[Model], names: Iterable[str] | dict[str, Any],
) -> tuple[str, tuple[Field[Any, Any], ...]]:
    """``names`` equal to bound values (``%s``), each :class:`Fixed` value of a ``where`` mapping
    written as its literal; the fields of the bound ones."""
    fixed = names if isinstance(names, dict) else {}
    terms, fields = [], []
    for name in names:
        field = _field(model, name)
        if type(fixed.get(name)) is Fixed:
            terms.append(f"{_column(conn, model, field)} = '{fixed[name]}'")
        else:
            terms.append(f"{_column(conn, model, field)} = %s")
            fields.append(field)
    return " AND ".join(terms), tuple(fields)


def _lookup_params(conn: BaseDatabaseWrapper, fields: Sequence[Field[Any, Any]], values: Iterable[Any]) -> list[Any]:
    params = []
    for field, value in zip(fields, (v for v in values if type(v) is not Fixed), strict=True):
        if value is None:
            raise ValueError(f"{field.name}: compare with a value; this module writes no IS NULL")
        params.append(field.get_db_prep_value(value, conn, prepared=False))
    return params


# --- writing -------------------------------------------------------------------------------------


def insert(
    model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]], *, returning: bool = False, db: DB = None,
    on_conflict: str = "",
) -> list[Any]:
    """INSERT ``rows`` (values of the fields ``names``, in that order) as multi-row statements,
    like ``bulk_create`` (no signals, no ``auto_now``: pass every value). With ``returning``, the
    new primary keys, in order. ``on_conflict``: an ``ON CONFLICT ...`` clause for the statement
    (an upsert; its SQL is the caller's, a constant for the database it was written for)."""
    if not rows:
        return []
    alias, conn = db or _db(model, write=True)
    per_statement = max(1, BATCH_PARAMS // len(names))
    pks: list[Any] = []
    for start in range(0, len(rows), per_statement):
        batch = rows[start:start + per_statement]
        key = (conn.vendor, "insert", model, tuple(names), len(batch), returning, on_conflict)
        built = _statements.get(key)
        if built is None:
            fields = tuple(_field(model, name) for name in names)
            columns = ", ".join(conn.ops.quote_name(str(f.column)) for f in fields)
            row = "(" + ", ".join(["%s"] * len(fields)) + ")"
            sql = f"INSERT INTO {_table(conn, model)} ({columns}) VALUES {', '.join([row] * len(batch))}"
            if on_conflict:
                sql += f" {on_conflict}"
            if returning:
                sql += f" RETURNING {_column(conn, model, _pk(model))}"
            built = _statements[key] = (sql, fields)
        sql, fields = built
        saves = savers.savers_of(key, fields)
        params = [save(v, conn) for values in batch for save, v in zip(saves, values, strict=True)]
        if returning:
            pks.extend(r[0] for r in _execute(conn, sql, params, fetch=True))
        else:
            _execute(conn, sql, params)
    return pks


def _pk(model: type[Model]) -> Field[Any, Any]:
    return cast("Field[Any, Any]", model._meta.pk)


def create[M: Model](obj: M) -> M:
    """``obj.save(force_insert=True)`` for a new row, in one prepared INSERT (``auto_now`` and
    defaults applied by the fields, the generated key read back). A model someone listens to
    (``pre_save``/``post_save``) is saved by the ORM, so its receivers still run."""
    return bulk_create([obj], signals=True)[0]


def bulk_create[M: Model](objs: list[M], *, signals: bool = False, db: DB = None) -> list[M]:
    """``Model.objects.bulk_create(objs)`` in one INSERT, setting each object's primary key."""
    if not objs:
        return objs
    model = type(objs[0])
    alias, conn = db or _db(model, write=True)
    pk = _pk(model)
    auto_pk = isinstance(pk, AutoField)
    listened = signals and (driver.listened(pre_save, model) or driver.listened(post_save, model))
    if listened or (auto_pk and not conn.features.can_return_rows_from_bulk_insert):
        # Receivers to run, or a backend that cannot return the keys (MySQL): the ORM's way.
        if not signals:
            return model._default_manager.db_manager(alias).bulk_create(objs)
        for obj in objs:
            obj.save(force_insert=True, using=alias)
        return objs
    fields = _insert_fields(model)
    row_of = _row_of(model)
    rows = [row_of(obj) for obj in objs]
    pks = insert(model, [f.attname for f in fields], rows, returning=auto_pk, db=db)
    for i, obj in enumerate(objs):
        if auto_pk:
            setattr(obj, pk.attname, pks[i])
        obj._state.adding = False
        obj._state.db = alias
    return objs


def update(model: type[Model], where: dict[str, Any], values: dict[str, Any], *, db: DB = None) -> int:
    """``Model.objects.filter(**where).update(**values)`` (equality only): the row count."""
    alias, conn = db or _db(model, write=True)
    key = (conn.vendor, "update", model, tuple(values), tuple(where), _fixed(where))
    built = _statements.get(key)
    if built is None:
        set_fields = tuple(_field(model, name) for name in values)
        condition, where_fields = _where(conn, model, where)
        assignments = ", ".join(f"{conn.ops.quote_name(str(f.column))} = %s" for f in set_fields)
        sql = f"UPDATE {_table(conn, model)} SET {assignments} WHERE {condition}"
        built = _statements[key] = (sql, set_fields + where_fields)
    sql, fields = built
    n = len(values)
    params = [save(v, conn) for save, v in zip(savers.savers_of(key, fields[:n]), values.values(), strict=True)]
    params += _lookup_params(conn, fields[n:], where.values())
    return int(_execute(conn, sql, params))


def requeue(run_id: Any, old: str, new: str, now: datetime, *, unless_pending: str | None = None) -> int:
    """Move a run from ``old`` to ``new``, its generation bumped and its lease owner cleared; with
    ``unless_pending`` (a call status) only if no call of the run has that status. One statement:
    of two decisions racing on one run, the second sees the first's call decided."""
    alias, conn = _db(AgentRun, write=True)
    key = (conn.vendor, "requeue", _pending_key(unless_pending))
    built = _statements.get(key)
    if built is None:
        built = _statements[key] = (_requeue_sql(conn, unless_pending=unless_pending), ())
    return int(_execute(conn, built[0], _requeue_params(conn, run_id, old, new, now, unless_pending)))


def _pending_key(unless_pending: str | None) -> Any:
    """What of ``unless_pending`` is in :func:`_requeue_sql`'s SQL: its literal if it is fixed."""
    return None if unless_pending is None else unless_pending if type(unless_pending) is Fixed else True


def _requeue_sql(conn: BaseDatabaseWrapper, *, unless_pending: str | None, besides: bool = False) -> str:
    """:func:`requeue`'s ``UPDATE``; with ``besides``, one call of the run is not counted pending.
    ``unless_pending`` is bound, or written as its literal if it is :class:`Fixed`."""
    q = conn.ops.quote_name
    run = {name: _field(AgentRun, name) for name in ("id", "status", "generation", "lease_owner", "updated_at")}
    sql = (
        f"UPDATE {_table(conn, AgentRun)} SET {q(str(run['status'].column))} = %s, "
        f"{q(str(run['generation'].column))} = {_column(conn, AgentRun, run['generation'])} + 1, "
        f"{q(str(run['lease_owner'].column))} = NULL, {q(str(run['updated_at'].column))} = %s "
        f"WHERE {_column(conn, AgentRun, run['id'])} = %s AND {_column(conn, AgentRun, run['status'])} = %s"
    )
    if unless_pending is not None:
        pending = f"'{unless_pending}'" if type(unless_pending) is Fixed else "%s"
        sql += (
            f" AND NOT EXISTS (SELECT 1 FROM {_table(conn, ToolCall)} WHERE "
            f"{_column(conn, ToolCall, _field(ToolCall, 'run'))} = {_column(conn, AgentRun, run['id'])} "
            f"AND {_column(conn, ToolCall, _field(ToolCall, 'status'))} = {pending}"
            + (f" AND {_column(conn, ToolCall, _pk(ToolCall))} <> %s" if besides else "")
            + ")"
        )
    return sql


def _requeue_params(
    conn: BaseDatabaseWrapper, run_id: Any, old: str, new: str, now: datetime, unless_pending: str | None,
    besides: Any = None,
) -> list[Any]:
    params = [new, savers.saver(_field(AgentRun, "updated_at"))(now, conn), _pk(AgentRun).get_db_prep_value(run_id, conn), old]
    if unless_pending is not None and type(unless_pending) is not Fixed:
        params.append(unless_pending)
    if besides is not None:
        params.append(_pk(ToolCall).get_db_prep_value(besides, conn))
    return params


def requeue_fetch(run_id: Any, old: str, new: str, now: datetime, *, unless_pending: str | None = None) -> int | None:
    """:func:`requeue`, then the run's new generation if it woke it (None if not), in one
    transaction."""
    alias, conn = _db(AgentRun, write=True)
    if conn.features.can_return_rows_from_update:  # one statement: UPDATE ... RETURNING
        return _requeue_generation(conn, run_id, old, new, now, unless_pending)
    with transaction.atomic(using=alias, savepoint=False):
        return _requeue_generation(conn, run_id, old, new, now, unless_pending)


def _requeue_generation(
    conn: BaseDatabaseWrapper, run_id: Any, old: str, new: str, now: datetime, unless_pending: str | None,
) -> int | None:
    """:func:`requeue`, then the new generation (None if it did not wake the run): one statement
    with ``RETURNING`` where the database has it, else two (in the caller's transaction)."""
    if not conn.features.can_return_rows_from_update:
        if not requeue(run_id, old, new, now, unless_pending=unless_pending):
            return None
        return int(values(AgentRun, "generation", "id", id=run_id)[0])
    key = (conn.vendor, "requeue_returning", _pending_key(unless_pending))
    built = _statements.get(key)
    if built is None:
        sql = _requeue_sql(conn, unless_pending=unless_pending)
        sql += f" RETURNING {_column(conn, AgentRun, _field(AgentRun, 'generation'))}"
        built = _statements[key] = (sql, ())
    rows = _execute(conn, built[0], _requeue_params(conn, run_id, old, new, now, unless_pending), fetch=True)
    return int(rows[0][0]) if rows else None


# --- reading -------------------------------------------------------------------------------------

#: the columns that have converters: (index in the row, the converters applied in turn)
Reader = list[tuple[int, Callable[[Any], Any]]]


def _reader(conn: BaseDatabaseWrapper, model: type[Model], names: Sequence[str] | None = None) -> Reader:
    """For each field (every concrete field by default) with converters, the ORM's converters of
    its values (the backend's, then the field's ``from_db_value``: ``SQLCompiler.get_converters``)
    as one function (:func:`.driver.converter`)."""
    key = (conn.vendor, model, tuple(names) if names is not None else None)
    reader = _readers.get(key)
    if reader is None:
        fields = model._meta.concrete_fields if names is None else [_field(model, n) for n in names]
        reader = []
        for i, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            converters = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
            if converters:
                reader.append((i, driver.converter(conn, col, converters)))
        _readers[key] = reader
    return reader


def _convert(conn: BaseDatabaseWrapper, reader: Reader, row: Sequence[Any]) -> list[Any]:
    values = list(row)
    for i, convert in reader:
        values[i] = convert(values[i])
    return values


def _columns(conn: BaseDatabaseWrapper, model: type[Model]) -> str:
    return ", ".join(_column(conn, model, f) for f in model._meta.concrete_fields)


def select[M: Model](
    model: type[M], *, order_by: Sequence[str] = (), limit: int | None = None, alias: str | None = None,
    for_update: bool = False, **where: Any,
) -> list[M]:
    """``list(Model.objects.using(alias).filter(**where).order_by(*order_by)[:limit])``
    (equality only; ascending order), or with ``for_update`` as ``select_for_update()`` (nothing
    added where the backend has no ``FOR UPDATE``, as in the ORM). ``alias`` defaults to the
    router's database for the model."""
    if alias is None:
        alias, conn = _db(model, write=for_update)
    else:
        conn = connections[alias]
    key = (conn.vendor, "select", model, tuple(where), _fixed(where), tuple(order_by), limit is not None, for_update)
    built = _statements.get(key)
    if built is None:
        condition, fields = _where(conn, model, where)
        sql = f"SELECT {_columns(conn, model)} FROM {_table(conn, model)} WHERE {condition}"
        if order_by:
            sql += " ORDER BY " + ", ".join(_column(conn, model, _field(model, name)) for name in order_by)
        if limit is not None:
            sql += " LIMIT %s"
        if for_update and conn.features.has_select_for_update:
            sql += " FOR UPDATE"
        built = _statements[key] = (sql, fields)
    sql, fields = built
    params = _lookup_params(conn, fields, where.values())
    if limit is not None:
        params.append(int(limit))
    rows = _execute(conn, sql, params, fetch=True)
    reader = _reader(conn, model)
    return [driver.from_db(model, alias, _convert(conn, reader, row)) for row in rows]


def get[M: Model](model: type[M], *, for_update: bool = False, alias: str | None = None, **where: Any) -> M | None:
    """``Model.objects.filter(**where).first()`` (equality only, at most one row expected), or
    with ``for_update`` as ``select_for_update()``."""
    rows = select(model, for_update=for_update, alias=alias, **where)
    return rows[0] if rows else None


def refresh(obj: Model, alias: str | None = None) -> None:
    """``obj.refresh_from_db()``: every field read again, cached related objects dropped (the
    forward ones and the reverse one-to-one ones), the prefetched ones too."""
    model = type(obj)
    fresh = get(model, alias=alias, **{_pk(model).name: obj.pk})
    if fresh is None:
        raise model.DoesNotExist(f"{model.__name__} matching query does not exist.")  # type: ignore[attr-defined]
    if hasattr(obj, "_prefetched_objects_cache"):
        obj._prefetched_objects_cache = {}
    names, cached = _refreshed(model)
    if names is not None:  # plain attributes (driver.plain_names): stored as setattr stores them
        attributes, fresh_attributes = obj.__dict__, fresh.__dict__
        for name in names:
            attributes[name] = fresh_attributes[name]
        cache = obj._state.fields_cache
        if cache:  # the relations' cached objects, forward and reverse, as is_cached/delete_cached_value
            for name in cached:
                cache.pop(name, None)
        obj._state.db = fresh._state.db
        return
    for field in model._meta.concrete_fields:
        setattr(obj, field.attname, getattr(fresh, field.attname))
        if field.is_relation and field.is_cached(obj):  # type: ignore[attr-defined]
            field.delete_cached_value(obj)  # type: ignore[attr-defined]
    for relation in model._meta.related_objects:
        if relation.is_cached(obj):
            relation.delete_cached_value(obj)
    obj._state.db = fresh._state.db


#: model -> (its plain attribute names or None, the cache names of its relations): :func:`refresh`
_refresh_plan: dict[type[Model], tuple[tuple[str, ...] | None, tuple[str, ...]]] = {}


def _refreshed(model: type[Model]) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    plan = _refresh_plan.get(model)
    if plan is None:
        relations = [f for f in model._meta.concrete_fields if f.is_relation] + list(model._meta.related_objects)
        plan = _refresh_plan[model] = (driver.plain_names(model), tuple(r.cache_name for r in relations))  # type: ignore[union-attr]
    return plan


def values(model: type[Model], name: str, order_by: str, **where: Any) -> list[Any]:
    """``Model.objects.filter(**where).order_by(order_by).values_list(name, flat=True)``."""
    alias, conn = _db(model, write=False)
    key = (conn.vendor, "values", model, name, order_by, tuple(where), _fixed(where))
    built = _statements.get(key)
    if built is None:
        condition, fields = _where(conn, model, where)
        sql = (
            f"SELECT {_column(conn, model, _field(model, name))} FROM {_table(conn, model)} "
            f"WHERE {condition} ORDER BY {_column(conn, model, _field(model, order_by))}"
        )
        built = _statements[key] = (sql, fields)
    sql, fields = built
    rows = _execute(conn, sql, _lookup_params(conn, fields, where.values()), fetch=True)
    reader = _reader(conn, model, (name,))
    return [_convert(conn, reader, row)[0] for row in rows]


def run_and_messages(run_id: Any, status: str) -> tuple[AgentRun | None, list[Any]]:
    """``get(AgentRun, id=run_id, status=status)`` and, if there is such a run, its messages'
    data in order (``values(RunMessage, "data", "seq", run_id=...)``). On PostgreSQL one
    statement (the messages as one JSON array), on SQLite too (their texts joined), elsewhere two."""
    alias, conn = _db(AgentRun, write=False)
    data = _field(RunMessage, "data")
    # the one-statement forms below decode all the messages at once, with storable.loads
    decoded = data.decoder in (None, StoredJSONDecoder)  # type: ignore[attr-defined]
    if decoded and conn.vendor == "sqlite":
        found = _sqlite_run_and_messages(conn, alias, run_id, status)
        if found is not None:
            return found
    if not decoded or conn.vendor != "postgresql":
        run = get(AgentRun, id=run_id, status=status)
        return run, ([] if run is None else values(RunMessage, "data", "seq", run_id=run.pk))
    key = (conn.vendor, "run_and_messages")
    built = _statements.get(key)
    if built is None:
        q = conn.ops.quote_name
        condition, fields = _where(conn, AgentRun, ("id", "status"))
        messages = _table(conn, RunMessage)
        sql = (
            f"SELECT {_columns(conn, AgentRun)}, (SELECT COALESCE(json_agg({messages}.{q(str(data.column))} "
            f"ORDER BY {messages}.{q(str(_field(RunMessage, 'seq').column))}), '[]')::text FROM {messages} "
            f"WHERE {messages}.{q(str(_field(RunMessage, 'run').column))} = {_column(conn, AgentRun, _pk(AgentRun))}) "
            f"FROM {_table(conn, AgentRun)} WHERE {condition}"
        )
        built = _statements[key] = (sql, fields)
    sql, fields = built
    rows = _execute(conn, sql, _lookup_params(conn, fields, (run_id, status)), fetch=True)
    if not rows:
        return None, []
    run = driver.from_db(AgentRun, alias, _convert(conn, _reader(conn, AgentRun), rows[0][:-1]))
    return run, loads(rows[0][-1])  # the field's decoding (storable), for the array at once


def _sqlite_run_and_messages(
    conn: BaseDatabaseWrapper, alias: str, run_id: Any, status: str,
) -> tuple[AgentRun | None, list[Any]] | None:
    """:func:`run_and_messages` in one statement on SQLite (3.40 has no ``ORDER BY`` inside an
    aggregate): the messages' texts joined by ``group_concat`` over a subquery in ``seq`` order,
    with their ``seq`` values joined alike and their counts. None (read them apart) unless the
    ``seq`` values came in order and no text was NULL: the order is checked, not assumed."""
    key = (conn.vendor, "run_and_messages")
    built = _statements.get(key)
    if built is None:
        q = conn.ops.quote_name
        condition, fields = _where(conn, AgentRun, ("id", "status"))
        seq, text, run = (q(str(_field(RunMessage, n).column)) for n in ("seq", "data", "run"))
        sql = (
            f"SELECT {_columns(conn, AgentRun)}, m.n, m.k, m.seqs, m.texts FROM {_table(conn, AgentRun)}, "
            f"(SELECT count(*) AS n, count(t) AS k, group_concat(s) AS seqs, group_concat(t, ',') AS texts FROM "
            f"(SELECT {seq} AS s, {text} AS t FROM {_table(conn, RunMessage)} WHERE {run} = %s ORDER BY {seq})) AS m "
            f"WHERE {condition}"
        )
        built = _statements[key] = (sql, (_field(RunMessage, "run"), *fields))
    sql, fields = built
    rows = _execute(conn, sql, _lookup_params(conn, fields, (run_id, run_id, status)), fetch=True)
    if not rows:
        return None, []
    count, texts, seqs, joined = rows[0][-4:]
    if count != texts:
        return None
    if count:
        numbers = [int(n) for n in seqs.split(",")]
        if any(a >= b for a, b in zip(numbers, numbers[1:], strict=False)):
            return None
    found = driver.from_db(AgentRun, alias, _convert(conn, _reader(conn, AgentRun), rows[0][:-4]))
    return found, (loads(f"[{joined}]") if count else [])


def calls_with_decisions(run_id: Any, call_ids: Sequence[str]) -> list[ToolCall]:
    """``ToolCall.objects.filter(run_id=run_id, tool_call_id__in=call_ids)
    .select_related("decision")``: one LEFT JOIN; each call's decision (or its absence) is cached
    on it as ``select_related`` caches it."""
    if not call_ids:
        return []
    alias, conn = _db(ToolCall, write=False)
    key = (conn.vendor, "calls", len(call_ids))
    built = _statements.get(key)
    if built is None:
        in_list = ", ".join(["%s"] * len(call_ids))
        sql = (
            f"SELECT {_columns(conn, ToolCall)}, {_columns(conn, Decision)} FROM {_table(conn, ToolCall)} "
            f"LEFT OUTER JOIN {_table(conn, Decision)} ON "
            f"{_column(conn, Decision, _field(Decision, 'tool_call'))} = {_column(conn, ToolCall, _pk(ToolCall))} "
            f"WHERE {_column(conn, ToolCall, _field(ToolCall, 'run'))} = %s "
            f"AND {_column(conn, ToolCall, _field(ToolCall, 'tool_call_id'))} IN ({in_list})"
        )
        built = _statements[key] = (sql, (_field(ToolCall, "run"),))
    sql, (run_field,) = built
    rows = _execute(conn, sql, [run_field.get_db_prep_value(run_id, conn), *call_ids], fetch=True)
    calls_reader, decisions_reader = _reader(conn, ToolCall), _reader(conn, Decision)
    n = len(ToolCall._meta.concrete_fields)
    relation: Any = ToolCall._meta.get_field("decision")  # the reverse one-to-one
    link = _field(Decision, "tool_call")
    calls = []
    for row in rows:
        call = driver.from_db(ToolCall, alias, _convert(conn, calls_reader, row[:n]))
        decision = None
        if row[n] is not None:
            decision = driver.from_db(Decision, alias, _convert(conn, decisions_reader, row[n:]))
            link.set_cached_value(decision, call)  # type: ignore[attr-defined]
        relation.set_cached_value(call, decision)
        calls.append(call)
    return calls


# --- one write transaction as one statement ---------------------------------------------------------


class Batch:
    """The writes of one transaction of the hot path: a *gate* (a compare-and-set ``UPDATE``, or
    the ``INSERT`` of a new row) and what is written only if the gate matched.

    Where the database has data-modifying ``WITH`` (PostgreSQL), :meth:`run` sends the whole
    transaction as **one statement**: the gate's ``UPDATE ... RETURNING`` first, every other write
    conditioned on it (``WHERE EXISTS (SELECT 1 FROM gate)``), in autocommit or inside the caller's
    transaction. One round trip instead of ``BEGIN``, a statement each and ``COMMIT``: a statement
    is atomic, so the guarantees are a transaction's, and if the gate does not match nothing at
    all is written. The sub-statements share one snapshot, so none may depend on another's effect
    (each row is written at most once; :meth:`requeue` names the call whose decision it goes with).

    Elsewhere (SQLite), or when a step needs the ORM (a model with ``pre_save``/``post_save``
    receivers, a :meth:`call`), the steps run one by one in ``transaction.atomic()``, stopping
    after the gate if it did not match: the same rows either way.

    ``durable=False`` is for a transaction whose loss harms nothing (the claim of a queued run,
    see ``DbJournal.before_model``): its commit does not wait for the disk. It is as atomic and
    as visible to every other connection at once as any commit, and survives a killed client;
    only a crash of the database server or its machine before the next flush can lose it. The
    next commit that does wait (of any connection: the log is flushed in order) takes it to disk
    with itself. On PostgreSQL it commits with ``synchronous_commit`` off for that transaction
    alone; on SQLite in WAL mode with ``synchronous=NORMAL`` for it alone (the connection's level
    is set back at once). Inside the caller's transaction, with a rollback journal, or on another
    database, it is an ordinary commit.
    """

    def __init__(self, *, durable: bool = True) -> None:
        self.alias, self.conn = _db(AgentRun, write=True)
        #: the database of every step, when no router could send one elsewhere
        self._db: DB = None if router.routers else (self.alias, self.conn)
        self.durable = durable
        self._steps: list[tuple[Any, ...]] = []
        self._combined = self.conn.vendor == "postgresql"
        #: no step needs the ORM (no :meth:`call`, no listened model): see :func:`.driver.sqlite_transaction`
        self._plain = True
        #: the row count of each step, in order (the gate's first), once run
        self.counts: list[int] = []
        #: the new generation of the run each :meth:`requeue` step woke, by step
        self.generations: dict[int, int] = {}
        #: (model, pk) of the row :meth:`lock_first` locks before the gate
        self._lock: tuple[type[Model], Any] | None = None

    def lock_first(self, model: type[Model], pk: Any) -> None:
        """Lock that row before the gate (``SELECT ... FOR NO KEY UPDATE`` where the database has
        row locks): for a batch whose gate is a call but which also writes its run, so that it
        takes the run's lock first, as every other writer of a run and its calls does (a worker's
        fenced write, a cancel, the reconciler). Two orders deadlocked on PostgreSQL."""
        self._lock = (model, pk)

    # The steps. Each returns its index in ``counts``.

    def gate(self, model: type[Model], where: dict[str, Any], values: dict[str, Any]) -> int:
        """``filter(**where).update(**values)``: the rest is written only if it changed a row."""
        return self._add("update", model, where, values)

    def gate_create(self, obj: Model) -> int:
        """Insert ``obj`` (:func:`create`): the rest is always written with it."""
        if _listened(obj):
            self._combined = self._plain = False
        return self._add("create", [obj])

    def insert(
        self, model: type[Model], names: Sequence[str], rows: Sequence[Sequence[Any]], *, on_conflict: str = "",
    ) -> int:
        """:func:`insert` (no primary keys read back), with its ``on_conflict`` clause: an upsert
        is part of the one statement too (``INSERT ... SELECT ... ON CONFLICT`` in its ``WITH``)."""
        return self._add("insert", model, tuple(names), rows, on_conflict)

    def create(self, objs: Sequence[Model]) -> int:
        """:func:`bulk_create` with signals: the new keys set on ``objs``."""
        if objs and _listened(objs[0]):
            self._combined = self._plain = False
        return self._add("create", objs)

    def update(self, model: type[Model], where: dict[str, Any], values: dict[str, Any]) -> int:
        return self._add("update", model, where, values)

    def requeue(self, run_id: Any, old: str, new: str, now: datetime, *, unless_pending: str, besides: Any) -> int:
        """:func:`requeue` with ``unless_pending``, not counting the call ``besides`` (whose status
        an earlier step of this batch changes, unseen by this one when the batch is one statement).
        If it wakes the run, ``generations[step]`` is the run's new generation."""
        return self._add("requeue", run_id, old, new, now, unless_pending, besides)

    def call(self, fn: Callable[[], Any]) -> int:
        """Anything else, in order (the steps then run one by one)."""
        self._combined = self._plain = False
        return self._add("call", fn)

    def _add(self, *step: Any) -> int:
        if step[0] == "create" and not step[1]:
            return -1  # nothing to insert
        self._steps.append(step)
        return len(self._steps) - 1

    # Running them.

    def run(self) -> bool:
        """Write the batch; whether the gate matched (if not, nothing was written)."""
        if not self._steps:
            raise ValueError("a batch needs its gate")
        # Only a transaction of its own may skip the wait: inside the caller's, the setting would
        # hold for the caller's writes too.
        no_wait = not self.durable and self.conn.get_autocommit() and not self.conn.in_atomic_block
        if self._combined:
            params = [] if self._lock is None else [_pk(self._lock[0]).get_db_prep_value(self._lock[1], self.conn)]
            for step in self._steps:
                params += _step_params(self.conn, step)
            if len(params) <= COMBINED_MAX_PARAMS:
                return self._run_combined(params, no_wait)
        self.counts = []
        conn = self.conn
        if (self._plain and conn.vendor == "sqlite" and not conn.in_atomic_block and conn.get_autocommit()
                and not conn.execute_wrappers and not conn.queries_logged):
            with _sqlite_no_wait(conn) if no_wait else nullcontext(), driver.sqlite_transaction(conn):
                return self._run_steps()
        # Inside the caller's transaction no savepoint: a failing step dooms the whole of it.
        outer = getattr(conn, "_nexo_cursor", None)  # a batch run by a step of another
        with atomic(conn, self.alias, wait=not no_wait), conn.cursor() as cursor:
            conn._nexo_cursor = cursor  # type: ignore[attr-defined]
            try:
                if self._lock is not None:
                    lock(*self._lock, alias=self.alias)
                return self._run_steps()
            finally:
                conn._nexo_cursor = outer  # type: ignore[attr-defined]

    def _run_steps(self) -> bool:
        for i, step in enumerate(self._steps):
            self.counts.append(self._run_step(i, step))
            if i == 0 and not self.counts[0]:
                return False
        return True

    def _run_step(self, index: int, step: tuple[Any, ...]) -> int:
        kind = step[0]
        if kind == "update":
            return update(step[1], step[2], step[3], db=self._db)
        if kind == "create":
            return len(bulk_create(list(step[1]), signals=True, db=self._db))
        if kind == "insert":
            insert(step[1], step[2], step[3], db=self._db, on_conflict=step[4])
            return len(step[3])
        if kind == "requeue":
            run_id, old, new, now, unless_pending, _ = step[1:]
            generation = _requeue_generation(self.conn, run_id, old, new, now, unless_pending)
            if generation is None:
                return 0
            self.generations[index] = generation
            return 1
        step[1]()
        return 1

    def _run_combined(self, params: list[Any], no_wait: bool) -> bool:
        conn = self.conn
        lock = None if self._lock is None else self._lock[0]
        key = (conn.vendor, "batch", no_wait, lock, tuple(_shape(step) for step in self._steps))
        built = _statements.get(key)
        if built is None:
            built = (_combined_sql(conn, self._steps, no_wait, lock), ())
            if len(_batch_shapes) < MAX_BATCH_SHAPES:  # rows per step vary: keep the cache bounded
                _batch_shapes.add(key)
                _statements[key] = built
        row = _execute(conn, built[0], params, fetch=True)[0]
        self.counts = [int(n) for n in row[: len(self._steps)]]
        if not self.counts[0]:
            return False
        keys = iter(row[len(self._steps):])
        for i, step in enumerate(self._steps):
            if step[0] == "requeue":
                generation = next(keys)
                if generation is not None:
                    self.generations[i] = int(generation)
                continue
            if step[0] != "create":
                continue
            objs = step[1]
            if _auto_pk(type(objs[0])):
                # The keys of one INSERT's rows are drawn in the order of its rows: sorted, they
                # are the rows' keys in order.
                for obj, pk in zip(objs, sorted(next(keys)), strict=True):
                    setattr(obj, _pk(type(obj)).attname, pk)
            for obj in objs:
                obj._state.adding = False
                obj._state.db = self.alias
        return True


def _listened(obj: Model) -> bool:
    model = type(obj)
    return driver.listened(pre_save, model) or driver.listened(post_save, model)


def _auto_pk(model: type[Model]) -> bool:
    return isinstance(_pk(model), AutoField)


def _insert_fields(model: type[Model]) -> list[Field[Any, Any]]:
    """The fields an INSERT writes: not an automatic key, not a column the database generates."""
    found = _inserted.get(model)
    if found is None:
        pk = _pk(model)
        found = _inserted[model] = [f for f in model._meta.concrete_fields
                                    if not (_auto_pk(model) and f is pk) and not getattr(f, "generated", False)]
    return found


#: model -> :func:`_insert_fields` (its fields do not change once the app registry is ready)
_inserted: dict[type[Model], list[Field[Any, Any]]] = {}


def _row_of(model: type[Model]) -> Callable[[Model], list[Any]]:
    """``[f.pre_save(obj, add=True) for f in _insert_fields(model)]`` as one function: a field whose
    ``pre_save`` is ``Field``'s own (the attribute as it is) read from the instance's attributes,
    any other (``auto_now``, a project's field) called as the ORM calls it."""
    found = _rows.get(model)
    if found is None:
        plan = [(f.attname, None if type(f).pre_save is Field.pre_save else f) for f in _insert_fields(model)]

        def row_of(obj: Model) -> list[Any]:
            attributes = obj.__dict__
            return [
                (attributes[name] if name in attributes else getattr(obj, name)) if field is None
                else field.pre_save(obj, True)
                for name, field in plan
            ]

        found = _rows[model] = row_of
    return found


#: model -> :func:`_row_of`
_rows: dict[type[Model], Callable[[Model], list[Any]]] = {}


def _shape(step: tuple[Any, ...]) -> tuple[Any, ...]:
    kind = step[0]
    if kind == "update":
        return (kind, step[1], tuple(step[2]), _fixed(step[2]), tuple(step[3]))
    if kind == "requeue":
        return (kind, _pending_key(step[5]))
    if kind == "create":
        return (kind, type(step[1][0]), len(step[1]))
    if kind == "insert":
        return (kind, step[1], step[2], len(step[3]), step[4])
    return (kind,)


def _step_params(conn: BaseDatabaseWrapper, step: tuple[Any, ...]) -> list[Any]:
    kind = step[0]
    if kind == "update":
        model, where, values = step[1:]
        shape: tuple[Any, ...] = ("update-step", model, tuple(values), tuple(where), _fixed(where))
        found = _step_fields.get(shape)
        if found is None:
            bound = [name for name, v in where.items() if type(v) is not Fixed]
            found = _step_fields[shape] = tuple(_field(model, name) for name in (*values, *bound))
        n = len(values)
        params = [save(v, conn) for save, v in zip(savers.savers_of(shape, found[:n]), values.values(), strict=True)]
        return params + _lookup_params(conn, found[n:], where.values())
    if kind == "create":
        model = type(step[1][0])
        fields = _insert_fields(model)
        saves = savers.savers_of(("create-step", model), fields)
        row_of = _row_of(model)
        return [save(v, conn) for obj in step[1] for save, v in zip(saves, row_of(obj), strict=True)]
    if kind == "insert":
        model, names, rows = step[1:4]
        shape = ("insert-step", model, names)
        saves = savers.known(shape) or savers.savers_of(shape, [_field(model, name) for name in names])
        return [save(v, conn) for values in rows for save, v in zip(saves, values, strict=True)]
    return _requeue_params(conn, *step[1:])


#: a step's shape -> the fields its values and lookups go to (:func:`_step_params`)
_step_fields: dict[tuple[Any, ...], tuple[Field[Any, Any], ...]] = {}


def _cast_type(conn: BaseDatabaseWrapper, field: Field[Any, Any]) -> str:
    """The column's type for a CAST, without a length: an over-long value then fails as it fails
    when inserted directly (an explicit cast to ``varchar(n)`` would cut it silently)."""
    db_type = str(field.db_type(conn))
    return db_type.split("(", 1)[0] if db_type.startswith("varchar(") else db_type


def lock(model: type[Model], pk: Any, *, alias: str | None = None) -> None:
    """Lock that row until the transaction ends, as :meth:`Batch.lock_first` does (``SELECT ...
    FOR NO KEY UPDATE`` where the database has row locks; nothing elsewhere, as in the ORM).
    ``alias`` defaults to the router's database for writing the model."""
    conn = _db(model, write=True)[1] if alias is None else connections[alias]
    if conn.features.has_select_for_update:
        _execute(conn, _lock_sql(conn, model), [_pk(model).get_db_prep_value(pk, conn)], fetch=True)


def _lock_sql(conn: BaseDatabaseWrapper, model: type[Model]) -> str:
    strength = "NO KEY UPDATE" if conn.features.has_select_for_no_key_update else "UPDATE"
    return f"SELECT 1 FROM {_table(conn, model)} WHERE {_column(conn, model, _pk(model))} = %s FOR {strength}"


def _combined_sql(
    conn: BaseDatabaseWrapper, steps: list[tuple[Any, ...]], no_wait: bool = False, lock: type[Model] | None = None,
) -> str:
    """``WITH s0 AS (gate RETURNING 1), s1 AS (... WHERE EXISTS (SELECT 1 FROM s0) RETURNING ...)
    SELECT (SELECT count(*) FROM s0), ..., ARRAY(SELECT pk FROM sN)``. ``no_wait`` adds a last
    column, ``set_config('synchronous_commit', 'off', true)``: sent in autocommit the statement
    is its transaction, so the setting holds for its commit alone (``SET LOCAL``). With ``lock``
    (:meth:`Batch.lock_first`) a first ``l AS (SELECT 1 ... FOR NO KEY UPDATE)`` that the gate's
    ``WHERE`` needs (an uncorrelated ``EXISTS``: evaluated once, before the gate locks its row)."""
    q = conn.ops.quote_name
    parts, counts, keys = [], [], []
    if lock is not None:
        parts.append(f"l AS ({_lock_sql(conn, lock)})")
    for i, step in enumerate(steps):
        kind = step[0]
        guard = "" if i == 0 else " AND EXISTS (SELECT 1 FROM s0)"
        if i == 0 and lock is not None:
            guard = " AND EXISTS (SELECT 1 FROM l)"
        returning = "1"
        if kind == "update":
            model, where, values = step[1:]
            assignments = ", ".join(f"{q(str(_field(model, n).column))} = %s" for n in values)
            condition, _ = _where(conn, model, where)
            body = f"UPDATE {_table(conn, model)} SET {assignments} WHERE {condition}{guard}"
        elif kind in ("create", "insert"):
            if kind == "create":
                model, n = type(step[1][0]), len(step[1])
                fields = _insert_fields(model)
                if _auto_pk(model):
                    returning = _column(conn, model, _pk(model))
                    keys.append(f"ARRAY(SELECT {q(str(_pk(model).column))} FROM s{i})")
            else:
                model, names, n = step[1], step[2], len(step[3])
                fields = [_field(model, name) for name in names]
            columns = ", ".join(q(str(f.column)) for f in fields)
            row = "(" + ", ".join(f"CAST(%s AS {_cast_type(conn, f)})" for f in fields) + ")"
            rows = ", ".join([row] * n)
            if i == 0:
                body = f"INSERT INTO {_table(conn, model)} ({columns}) VALUES {rows}"
            else:
                body = (
                    f"INSERT INTO {_table(conn, model)} ({columns}) SELECT * FROM (VALUES {rows}) AS v "
                    "WHERE EXISTS (SELECT 1 FROM s0)"
                )
            if kind == "insert" and step[4]:
                body += f" {step[4]}"
        elif kind == "requeue":
            body = _requeue_sql(conn, unless_pending=step[5], besides=True) + guard
            returning = _column(conn, AgentRun, _field(AgentRun, "generation"))
            keys.append(f"(SELECT max({q(str(_field(AgentRun, 'generation').column))}) FROM s{i})")
        else:
            raise ValueError(f"a {kind} step cannot be part of one statement")
        parts.append(f"s{i} AS ({body} RETURNING {returning})")
        counts.append(f"(SELECT count(*) FROM s{i})")
    tail = ["set_config('synchronous_commit', 'off', true)"] if no_wait else []
    return "WITH " + ", ".join(parts) + " SELECT " + ", ".join(counts + keys + tail)


@contextmanager
def atomic(conn: BaseDatabaseWrapper, alias: str, *, wait: bool = True) -> Iterator[None]:
    """``transaction.atomic(using=alias, savepoint=False)``; with ``wait=False`` its commit does
    not wait for the disk (see :class:`Batch`): for a transaction of its own only, so the caller
    checks that none is open."""
    if wait or conn.vendor not in ("postgresql", "sqlite"):
        with transaction.atomic(using=alias, savepoint=False):
            yield
    elif conn.vendor == "sqlite":
        with _sqlite_no_wait(conn), transaction.atomic(using=alias, savepoint=False):
            yield
    else:
        with transaction.atomic(using=alias, savepoint=False):
            with conn.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
            yield


@contextmanager
def _sqlite_no_wait(conn: BaseDatabaseWrapper) -> Iterator[None]:
    """Commit without an fsync of the log: ``synchronous=NORMAL`` for the enclosed transaction,
    in WAL mode only (with a rollback journal a commit that does not wait can corrupt the file on
    power loss). The connection's own level comes back afterwards, whatever happens."""
    conn.ensure_connection()
    raw = conn.connection
    wal = raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    level = raw.execute("PRAGMA synchronous").fetchone()[0]
    if not wal or level < SQLITE_FULL:
        yield
        return
    raw.execute(f"PRAGMA synchronous={SQLITE_NORMAL}")
    try:
        yield
    finally:
        raw.execute(f"PRAGMA synchronous={int(level)}")
