"""Reading a conversation: the runs linked by ``AgentRun.previous``, and the read-only prefix of a
follow-up's transcript (the earlier runs' own rows, never copied). The journal reads the prefix
when it drives a follow-up; the pages read the runs."""

from __future__ import annotations

from typing import Any

from django.db import connections, router

from ..core.agent import open_calls
from ..core.llm.base import Message
from ..models import AgentRun, RunMessage

#: What the model is told of a call an earlier run left without a result (a cancelled run).
NOT_RUN = "not run: its run ended ({status}) before this call ran"



def _chain(run_id: Any, *, forward: bool) -> list[Any]:
    """The ids of the runs before ``run_id`` (nearest first), or after it (next first), by one
    recursive query on the ``previous`` link (its index)."""
    alias = router.db_for_read(AgentRun)
    conn = connections[alias]
    q = conn.ops.quote_name
    table = q(AgentRun._meta.db_table)
    pk = q(str(AgentRun._meta.pk.column))
    prev = q(str(AgentRun._meta.get_field("previous").column))
    if forward:
        start = f"SELECT {pk}, 1 FROM {table} WHERE {prev} = %s"
        step = f"SELECT r.{pk}, c.depth + 1 FROM {table} r JOIN chain c ON r.{prev} = c.id"
    else:
        start = f"SELECT {prev}, 1 FROM {table} WHERE {pk} = %s AND {prev} IS NOT NULL"
        step = f"SELECT r.{prev}, c.depth + 1 FROM {table} r JOIN chain c ON r.{pk} = c.id WHERE r.{prev} IS NOT NULL"
    statement = f"WITH RECURSIVE chain(id, depth) AS ({start} UNION ALL {step}) SELECT id FROM chain ORDER BY depth"
    param = AgentRun._meta.pk.get_db_prep_value(run_id, conn)
    with conn.cursor() as cursor:
        cursor.execute(statement, [param])
        return [AgentRun._meta.pk.to_python(row[0]) for row in cursor.fetchall()]


def earlier_ids(run: AgentRun) -> list[Any]:
    """The ids of the runs before ``run`` in its conversation, first to last."""
    if run.previous_id is None:
        return []
    return [*reversed(_chain(run.previous_id, forward=False)), run.previous_id]


def prefix(run: AgentRun) -> list[Message]:
    """The earlier runs' messages, in conversation order: the read-only prefix of a follow-up's
    transcript. A call an earlier run left without a result (it was cancelled while the call
    waited) is given one here, as not run: never stored, since it is not that run's."""
    ids = earlier_ids(run)
    if not ids:
        return []
    rows: dict[Any, list[Message]] = {i: [] for i in ids}
    for run_id, data in RunMessage.objects.filter(run_id__in=ids).order_by("seq").values_list("run_id", "data"):
        rows[run_id].append(data)
    statuses = dict(AgentRun.objects.filter(pk__in=ids).values_list("pk", "status"))
    messages: list[Message] = []
    for run_id in ids:
        segment = rows[run_id]
        messages.extend(segment)
        for call in open_calls(segment):
            result = {"error": NOT_RUN.format(status=statuses.get(run_id, "ended"))}
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": result})
    return messages


def conversation(run: AgentRun) -> list[AgentRun]:
    """Every run of ``run``'s conversation, first to last."""
    ids = [*earlier_ids(run), run.pk, *_chain(run.pk, forward=True)]
    found = AgentRun.objects.in_bulk(ids)
    return [found[i] for i in ids if i in found]
