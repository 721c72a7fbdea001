"""How the hot path's values are prepared for the database: ``Field.get_db_prep_save``'s result,
by the same backend functions, without its layers, for the kinds of values the durable layer
writes (issue 34). Any other value, or a field class of someone else's, goes through
``get_db_prep_save`` itself. :mod:`.sql` uses these for every statement it builds."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.core.signals import setting_changed
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from ..storable import StoredJSONEncoder, StoredJSONField, StoredTextField, dumps, escape_text
from . import driver

Saver = Callable[[Any, BaseDatabaseWrapper], Any]

#: id(field) -> the field and how its values are prepared for the database (:func:`saver`)
_savers: dict[int, tuple[Field[Any, Any], Saver]] = {}

def saver(field: Field[Any, Any]) -> Saver:
    """``field.get_db_prep_save`` for the values the hot path writes, without its layers: the
    same result, by the same backend function, for a ``str`` in a char or text field, a ``bool``,
    an aware ``datetime`` (with ``USE_TZ``), a ``dict`` or ``list`` in a JSON field, a ``UUID`` in a
    UUID field or a foreign key to one; None in any of Django's fields of those kinds (SQL NULL, as
    their ``get_db_prep_save`` says). Any other value, or a field class of someone else's (a
    subclass may prepare differently), goes through ``get_db_prep_save`` itself."""
    found = _savers.get(id(field))  # by identity: a field's own hash is a Python method
    if found is None or found[0] is not field:
        found = _savers[id(field)] = (field, _make_saver(field))  # the field kept: its id stays its own
    return found[1]


#: a built statement's key -> the savers of its fields (:func:`savers_of`)
_statement_savers: dict[tuple[Any, ...], tuple[Saver, ...]] = {}


def savers_of(key: tuple[Any, ...], fields: Sequence[Field[Any, Any]]) -> tuple[Saver, ...]:
    """The savers of ``fields``, the fields of the statement built under ``key`` (looked up once
    for it, not once per value)."""
    savers = _statement_savers.get(key)
    if savers is None:
        savers = _statement_savers[key] = tuple(saver(f) for f in fields)
    return savers


def known(key: tuple[Any, ...]) -> tuple[Saver, ...] | None:
    """The savers :func:`savers_of` keeps for ``key``, if any (without building its fields)."""
    return _statement_savers.get(key)


def _make_saver(field: Field[Any, Any]) -> Saver:
    slow = field.get_db_prep_save
    kind = type(field)
    if kind in (models.CharField, models.TextField):
        return lambda v, conn: v if type(v) is str or v is None else slow(v, conn)
    if kind is StoredTextField:  # its get_prep_value: the text as stored (storable.escape_text)
        return lambda v, conn: escape_text(v) if type(v) is str else slow(v, conn)
    if kind is models.BooleanField:
        return lambda v, conn: v if type(v) is bool or v is None else slow(v, conn)
    if kind in _INTEGER_FIELDS:  # get_prep_value is int(v): the backend's adaptation is what is left
        internal = field.get_internal_type()
        return lambda v, conn: (conn.ops.adapt_integerfield_value(v, internal) if type(v) is int
                                else None if v is None else slow(v, conn))
    if kind is models.DateTimeField:

        def datetime_saver(v: Any, conn: BaseDatabaseWrapper) -> Any:
            global _last_datetime
            if type(v) is datetime and v.tzinfo is not None and driver.use_tz():
                if conn.vendor == "sqlite":  # its adapt_datetimefield_value for an aware value
                    # A batch writes one ``now`` in many rows: converted once.
                    last = _last_datetime
                    if last[0] is v and last[1] is conn:
                        return last[2]
                    text = str(v.astimezone(conn.timezone).replace(tzinfo=None))
                    _last_datetime = (v, conn, text)
                    return text
                return conn.ops.adapt_datetimefield_value(v)
            return None if v is None else slow(v, conn)

        return datetime_saver
    if kind is StoredJSONField and field.encoder is StoredJSONEncoder:  # type: ignore[attr-defined]
        # On SQLite adapt_json_value(v, encoder) is json.dumps(v, cls=encoder): the codec's text,
        # without building an encoder per value. Elsewhere the backend's own (psycopg's Jsonb).
        def stored_json_saver(v: Any, conn: BaseDatabaseWrapper) -> Any:
            if type(v) not in (dict, list):
                return None if v is None else slow(v, conn)
            return dumps(v) if conn.vendor == "sqlite" else conn.ops.adapt_json_value(v, StoredJSONEncoder)

        return stored_json_saver
    if kind in (models.JSONField, StoredJSONField):
        encoder = field.encoder  # type: ignore[attr-defined]
        return lambda v, conn: (conn.ops.adapt_json_value(v, encoder) if type(v) in (dict, list)
                                else None if v is None else slow(v, conn))
    target = field.target_field if kind is models.ForeignKey else field  # type: ignore[attr-defined]
    if type(target) is models.UUIDField:

        def uuid_saver(v: Any, conn: BaseDatabaseWrapper) -> Any:
            global _last_uuid
            if type(v) is uuid.UUID:
                if conn.features.has_native_uuid_field:
                    return v
                # A batch writes one run's id in many rows: its text made once (UUIDs are immutable).
                last = _last_uuid
                if last[0] is v:
                    return last[1]
                _last_uuid = (v, v.hex)
                return _last_uuid[1]
            return None if v is None else slow(v, conn)

        return uuid_saver
    return slow


#: the last UUID whose text a saver made: (value, text)
_last_uuid: tuple[Any, str] = (None, "")

#: the last aware datetime the SQLite saver converted: (value, connection, text)
_last_datetime: tuple[Any, Any, str] = (None, None, "")


def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    global _last_datetime
    if setting in ("USE_TZ", "TIME_ZONE", "DATABASES"):
        _last_datetime = (None, None, "")


setting_changed.connect(_forget_settings, dispatch_uid="nexo_django.durable.savers.forget_settings")


_INTEGER_FIELDS = (models.IntegerField, models.SmallIntegerField, models.BigIntegerField,
                   models.PositiveIntegerField, models.PositiveSmallIntegerField, models.PositiveBigIntegerField)
