"""The durable layer's statements straight to the database driver (issue 34).

Django's cursor costs each statement its layers: a wrapper object, the execute-wrapper chain, on
SQLite a regex that turns ``%s`` into ``?`` on every execution; each transaction ``atomic``'s
bookkeeping (autocommit off and on, ``on_commit`` hooks); each row read ``Model.__init__``'s
generic loop. :mod:`.sql` uses what is here when nothing can tell the difference: no execute
wrapper and no query logging on the connection (``CaptureQueriesContext``, ``DEBUG`` and the
benchmarks' counting install one, and then get Django's path: the same statements), no receiver
of the model's init signals. The checks Django's cursor makes are made here too (health check,
connection, async context, thread, broken transaction) and errors are wrapped as Django's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from importlib import import_module
from typing import Any, cast

from django.conf import settings
from django.core.signals import setting_changed
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField, Model
from django.db.models.base import DEFERRED, ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init
from django.dispatch import Signal

from ..storable import StoredJSONDecoder, StoredJSONField, StoredTextField, loads

#: a statement's SQL in sqlite3's own parameter style (``?``), converted once; at most
#: ``QMARK_MAX`` of them (statements with lists of any length are many: past it, converted each time)
_qmark: dict[str, str] = {}
QMARK_MAX = 512
#: Django's conversion (``django.db.backends.sqlite3.base.FORMAT_QMARK_REGEX``)
_FORMAT = re.compile(r"(?<!%)%s")


def execute_sqlite(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any], fetch: bool) -> Any:
    """What Django's cursor does for a statement (the async check and the connection, the broken
    transaction check, its errors wrapped as Django's), without its layers: the wrapper objects,
    the execute-wrapper chain and the regex that converts ``%s`` to ``?`` on every execution (the
    same conversion, done once per statement here)."""
    native = _qmark.get(sql) or qmark(sql)
    ready(conn)
    try:
        conn.validate_no_broken_transaction()
        with conn.wrap_database_errors:
            cursor = conn.connection.execute(native, params)
            return cursor.fetchall() if fetch else cursor.rowcount
    except Exception as exc:
        doom(conn, exc)
        raise


def qmark(sql: str) -> str:
    """``sql`` in sqlite3's parameter style, as Django's SQLite cursor converts it (kept)."""
    native = _FORMAT.sub("?", sql).replace("%%", "%")
    if len(_qmark) < QMARK_MAX:
        _qmark[sql] = native
    return native


def doom(conn: BaseDatabaseWrapper, exc: BaseException) -> None:
    """A statement failed: the enclosing atomic block can only roll back, as the ORM's statements
    do (``transaction.mark_for_rollback_on_error``)."""
    if conn.in_atomic_block:
        conn.needs_rollback = True
        conn.rollback_exc = exc  # type: ignore[attr-defined]


def ready(conn: BaseDatabaseWrapper) -> None:
    """What Django's ``connection.cursor()`` checks first: the health check (``CONN_HEALTH_CHECKS``),
    the connection (opened if need be; refused in an async context), its thread."""
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    conn.validate_thread_sharing()


def execute_driver(conn: BaseDatabaseWrapper, sql: str, params: Sequence[Any], fetch: bool) -> Any:
    """:func:`execute_sqlite` for PostgreSQL: the driver's cursor with the connection's time zone,
    as the backend's ``create_cursor`` makes it, without Django's wrapper around it.

    On psycopg 3 the statement goes in PostgreSQL's own placeholders (``$1``, ``$2``...: converted
    once per statement, as :func:`qmark` does for SQLite) on a ``RawCursor``, its values apart
    from the text (server-side binding), even where the connection binds them on the client
    (Django's default). So psycopg neither splits the text at its placeholders again at every
    execution (it keeps the split only for statements of at most 50 values and 4,096 characters,
    and the hot path's batches are longer) nor quotes each value in Python (it dumps them in C):
    together ~10 % of an approval cycle's CPU on PostgreSQL. Unless the connection asks for
    prepared statements (``server_side_binding`` on, and its ``prepare_threshold``), the statement
    is unnamed, never prepared: a pooler in transaction mode is fine, and PostgreSQL parses and
    plans it each time, as it does the text with the values inlined."""
    native = _dollar.get(sql)
    if native is None:
        native = dollar(sql)
    ready(conn)
    try:
        conn.validate_no_broken_transaction()
        with conn.wrap_database_errors:
            if _raw is None or not native:  # psycopg2, or a placeholder other than %s
                with conn.create_cursor() as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchall() if fetch else cursor.rowcount
            prepare = None if conn.settings_dict["OPTIONS"].get("server_side_binding") is True else False
            with _raw(conn) as cursor:
                cursor.execute(native, params, prepare=prepare)
                return cursor.fetchall() if fetch else cursor.rowcount
    except Exception as exc:
        doom(conn, exc)
        raise


#: a statement's SQL in PostgreSQL's own placeholders (``$1``...), converted once, or "" if it has
#: a placeholder other than ``%s`` (then psycopg converts it); at most ``QMARK_MAX`` of them
_dollar: dict[str, str] = {}
_PLACEHOLDER = re.compile(r"%(.)")


def dollar(sql: str) -> str:
    """``sql`` with its ``%s`` numbered as ``$1``, ``$2``... and ``%%`` made ``%``: what psycopg's
    server-side binding sends for it (kept). "" for any other placeholder (``%b``, ``%t``,
    ``%(name)s``), which psycopg's own conversion handles."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        if match.group(1) != "s":
            raise ValueError(match.group(0))
        count += 1
        return f"${count}"

    try:
        native = _PLACEHOLDER.sub(number, sql)
    except ValueError:
        native = ""
    if len(_dollar) < QMARK_MAX:
        _dollar[sql] = native
    return native


#: psycopg's ``RawCursor`` and Django's PostgreSQL backend module, looked up at the first statement
_postgres: tuple[Any, Any] | None = None


def _raw_cursor(conn: Any) -> Any:
    """The backend's ``create_cursor()`` (same connection, adapters and time zone), but psycopg's
    ``RawCursor``: ``$n`` placeholders, the values bound on the server."""
    global _postgres
    if _postgres is None:
        import psycopg

        _postgres = (psycopg.RawCursor, import_module("django.db.backends.postgresql.base"))  # names the stubs lack
    raw_cursor, base = _postgres
    cursor = raw_cursor(conn.connection)
    tzloader = conn.connection.adapters.get_loader(base.TIMESTAMPTZ_OID, base.Format.TEXT)
    if conn.timezone != tzloader.timezone:
        base.register_tzloader(conn.timezone, cursor)
    return cursor


def _psycopg3() -> bool:
    try:
        from django.db.backends.postgresql.psycopg_any import is_psycopg3
    except ImportError:  # no PostgreSQL driver at all: execute_driver is never called
        return False
    return bool(is_psycopg3)


#: how :func:`execute_driver` makes its cursor on psycopg 3, else None (psycopg2: the backend's own)
_raw: Callable[[Any], Any] | None = _raw_cursor if _psycopg3() else None


def listened(signal: Signal, sender: Any) -> bool:
    """``signal.has_listeners(sender)``, answered at once when the signal has no receiver at all
    (``pre_init``, ``post_init`` and nexo's own signals in most projects): ``has_listeners`` looks
    the sender up in a weak dictionary first, a Python call per check, ~30 checks per cycle."""
    return bool(signal.receivers) and signal.has_listeners(sender)


#: model -> the attribute names of its concrete fields, if its instances can be built without
#: ``Model.__init__`` (see :func:`from_db`, :func:`new`), else None
_plain: dict[type[Model], tuple[str, ...] | None] = {}


def from_db[M: Model](model: type[M], alias: str, values: list[Any]) -> M:
    """``model.from_db(alias, None, values)`` for a whole row: what ``Model.__init__`` does with
    one value per concrete field (each stored as the instance's attribute, ``_state`` set), without
    its generic loop, when nothing can tell the difference: the model's own ``__init__`` and
    ``from_db`` are Django's, no ``pre_init``/``post_init`` receiver listens, and every field's
    attribute is a plain deferred one (whose ``__set__``, if any, only stores the value)."""
    names = _plain.get(model, ())
    if names == ():
        names = _plain[model] = plain_names(model)
    if names is None or listened(pre_init, model) or listened(post_init, model):
        return cast("M", model.from_db(alias, None, values))  # type: ignore[arg-type]
    obj = model.__new__(model)
    state = ModelState()
    state.adding, state.db = False, alias
    attributes = obj.__dict__
    attributes["_state"] = state
    attributes.update(zip(names, values, strict=True))
    return obj


#: model -> (field, attname, name if a relation else None) of each field, for :func:`new`
_fields_of: dict[type[Model], list[tuple[Any, str, str | None]]] = {}


def new[M: Model](model: type[M], **kwargs: Any) -> M:
    """``model(**kwargs)`` for a new row, without ``Model.__init__``'s generic loop, when nothing
    can tell the difference (as :func:`from_db`; and every forward field concrete, none
    generated): each field's value from ``kwargs`` by its attribute name, a relation's object by
    its name through its descriptor (which checks its type and caches it), else the field's
    default; a generated field is left unset, as ``Model.__init__`` leaves it. Anything else (a
    property's name, an unknown or generated field's name, ``DEFERRED``) goes to
    ``Model.__init__``, with its errors."""
    names = _plain.get(model, ())
    if names == ():
        names = _plain[model] = plain_names(model)
    fields = _fields_of.get(model)
    if fields is None:
        opts = model._meta
        fields = _fields_of[model] = [
            (f, f.attname, f.name if f.is_relation else None) for f in opts.concrete_fields if not getattr(f, "generated", False)
        ] if len(opts.fields) == len(opts.concrete_fields) else []
    if names is None or not fields or listened(pre_init, model) or listened(post_init, model):
        return model(**kwargs)
    obj = model.__new__(model)
    attributes = obj.__dict__
    attributes["_state"] = ModelState()
    used = 0
    for field, attname, name in fields:
        if attname in kwargs:
            value = kwargs[attname]
            if value is DEFERRED:
                return model(**kwargs)
            attributes[attname] = value
            used += 1
        elif name is not None and name in kwargs:
            value = kwargs[name]
            if value is DEFERRED:
                return model(**kwargs)
            setattr(obj, name, value)
            used += 1
        else:
            attributes[attname] = field.get_default()
    if used != len(kwargs):
        return model(**kwargs)
    return obj


def plain_names(model: type[Model]) -> tuple[str, ...] | None:
    if model.__init__ is not Model.__init__ or model.from_db.__func__ is not Model.from_db.__func__:  # type: ignore[attr-defined]
        return None
    names = []
    for field in model._meta.concrete_fields:
        if type(getattr(model, field.attname, None)) not in (DeferredAttribute, ForeignKeyDeferredAttribute):
            return None
        names.append(field.attname)
    return tuple(names)


@contextmanager
def sqlite_transaction(conn: BaseDatabaseWrapper) -> Iterator[None]:
    """A transaction of its own on SQLite, begun and ended on the driver's connection as
    ``transaction.atomic(savepoint=False)`` does it there (``BEGIN``, with the connection's
    ``transaction_mode``; ``COMMIT``, or ``ROLLBACK`` on any error, the commit's included; errors
    wrapped as Django's), without its bookkeeping (autocommit switched off and on, ``on_commit``
    hooks, the atomic block's state). For a batch of the durable layer's own statements only
    (``nexo_django.durable.sql.Batch``): nothing inside it may use the ORM or register
    ``on_commit`` (the caller checks that no step does, and that no transaction is open)."""
    ready(conn)
    raw = conn.connection
    mode = getattr(conn, "transaction_mode", None)
    with conn.wrap_database_errors:
        raw.execute("BEGIN" if mode is None else f"BEGIN {mode}")
    try:
        # Its statements go to ``raw`` as they are (:func:`in_transaction`): the checks of
        # :func:`ready` were made above for the whole transaction, no atomic block is open to be
        # marked for rollback, and their errors are wrapped as Django's here, once.
        conn.__dict__[RAW] = raw
        try:
            with conn.wrap_database_errors:
                yield
        finally:
            conn.__dict__.pop(RAW, None)
        with conn.wrap_database_errors:
            raw.commit()
    except BaseException:
        if raw.in_transaction:
            with conn.wrap_database_errors:
                raw.rollback()
        raise


#: the attribute of a connection inside :func:`sqlite_transaction`: the driver's connection
RAW = "_nexo_raw"


def in_transaction(conn: BaseDatabaseWrapper) -> Any:
    """The driver's connection if ``conn`` is inside :func:`sqlite_transaction`, else None."""
    return conn.__dict__.get(RAW)


def execute_raw(raw: Any, sql: str, params: Sequence[Any], fetch: bool) -> Any:
    """A statement of a :func:`sqlite_transaction` (whose checks and error wrapping hold for it):
    the driver's ``execute`` with the ``?`` SQL, rows (``fetch``) or the row count."""
    cursor = raw.execute(_qmark.get(sql) or qmark(sql), params)
    return cursor.fetchall() if fetch else cursor.rowcount


# --- converters of the values read -------------------------------------------------------------

#: ``settings.USE_TZ``, read once per change of it (``settings`` is a lazy object: each read of it
#: is a Python call)
_tz: list[bool] = []


def use_tz() -> bool:
    if not _tz:
        _tz.append(bool(settings.USE_TZ))
    return _tz[0]


def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "USE_TZ":
        _tz.clear()


setting_changed.connect(_forget_settings, dispatch_uid="nexo_django.durable.driver.forget_settings")


def converter(conn: BaseDatabaseWrapper, col: Any, converters: Sequence[Any]) -> Callable[[Any], Any]:
    """The ORM's ``converters`` of a column's values (each called ``(value, col, conn)`` in turn) as
    one function of the value. Django's own converters of the hot path's columns (SQLite's
    datetime, UUID and boolean ones, the stored JSON and text fields' ``from_db_value``) all return
    NULL as it is: for those, NULL is returned at once and each runs without its generic layers
    (:func:`_quick`). Any other converter is called as the ORM calls it, NULL included."""
    quick = [_quick(conn, col, c) for c in converters]
    if any(q is None for q in quick):

        def convert(value: Any) -> Any:
            for c in converters:
                value = c(value, col, conn)
            return value

        return convert
    steps = cast("list[Callable[[Any], Any]]", quick)
    if len(steps) == 1:
        only = steps[0]
        return lambda value: None if value is None else only(value)

    def convert_all(value: Any) -> Any:
        for step in steps:
            if value is None:
                return None
            value = step(value)
        return value

    return convert_all


#: the last UUID text read and its UUID (a cycle reads one run's id in several rows)
_last_uuid: tuple[Any, Any] = (None, None)


def _uuid(value: Any) -> uuid.UUID:
    """``uuid.UUID(value)``, the last one kept: a UUID is immutable, so rows may share it."""
    global _last_uuid
    last = _last_uuid
    if value == last[0] and type(value) is str:
        return cast("uuid.UUID", last[1])
    found = uuid.UUID(value)
    _last_uuid = (value, found)
    return found


def _quick(conn: BaseDatabaseWrapper, col: Any, c: Any) -> Callable[[Any], Any] | None:
    """``c`` as a function of a non-NULL value, if it is one of Django's converters known to keep
    NULL (and to do exactly this with anything else); None otherwise."""
    func, owner = getattr(c, "__func__", None), getattr(c, "__self__", None)
    if func is None:
        return None
    if conn.vendor == "sqlite" and owner is conn.ops:
        from django.db.backends.sqlite3.operations import DatabaseOperations as SQLite

        if func is SQLite.convert_datetimefield_value:

            def aware(value: Any) -> Any:
                # convert_datetimefield_value on a naive datetime (what sqlite3 hands back):
                # with USE_TZ, timezone.make_aware(value, conn.timezone), which is this replace
                if type(value) is datetime and value.tzinfo is None:
                    return value.replace(tzinfo=conn.timezone) if use_tz() else value
                return c(value, col, conn)

            return aware
        if func is SQLite.convert_uuidfield_value:
            return _uuid
        if func is SQLite.convert_booleanfield_value:
            return lambda value: bool(value) if value in (1, 0) else value
        return None
    if func is JSONField.from_db_value and type(owner) is StoredJSONField and owner.decoder is StoredJSONDecoder:

        def stored_json(value: Any) -> Any:
            # JSONField.from_db_value on a column: json.loads(value, cls=StoredJSONDecoder), which
            # is storable.loads; text that is not JSON comes back as it is
            if type(value) is str:
                try:
                    return loads(value)
                except json.JSONDecodeError:
                    return value
            return c(value, col, conn)

        return stored_json
    if func is StoredTextField.from_db_value:
        return lambda value: c(value, col, conn)
    return None
