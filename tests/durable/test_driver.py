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
