"""What the database cannot hold, kept or refused at the edge (scripted models).

Durable tests run on SQLite here and again on PostgreSQL in the suite's PostgreSQL pass (jsonb
refuses NUL and NaN, gives ``1e16`` back as an integer and ``-0.0`` as ``0.0``; SQLite's JSON
columns check ``JSON_VALID``; neither driver encodes a lone surrogate).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from nexo_django import Agent, tool
from nexo_django.models import AgentRun, RunMessage, RunStatus, ToolCall, args_digest
from nexo_django.storable import (
    MAX_DEPTH,
    TEXT_MARK,
    StoredJSONDecoder,
    StoredJSONEncoder,
    UnstorableValue,
    escape_text,
    unescape_text,
)
from nexo_django.testing import ScriptedModel, reply, tool_call

#: Every value a model or a tool can produce that a database cannot hold as it is.
AWKWARD: dict[str, Any] = {
    "nul": "before\x00after",
    "lone_surrogates": "\ud800 high, \udfff low",
    "percent_and_nul": "100%\x00%0000",
    "nan": math.nan,
    "inf": float("1e999"),
    "minus_inf": -math.inf,
    "big": 1e16,
    "huge": 1.5e300,
    "minus_zero": -0.0,
    "tiny": 5e-324,
    "text_mark": TEXT_MARK + "starts with the mark",
    "key\x00with nul": {"\ud83d": [1e16, -0.0]},
    "__nexo__": {"__nexo__": "str", "v": "%0000"},
    "plain": ["unicode é ✓ 😀", 1, 1.5, True, None],
}

#: What a tool received, in this process (the inline queue runs jobs here).
RECEIVED: list[Any] = []


def same(a: Any, b: Any) -> bool:
    """Equal value for value: floats by their repr (NaN equals NaN, -0.0 differs from 0.0),
    types too (1e16 is not 10000000000000000)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):  # jsonb orders keys its own way: the same keys, each the same value
        return sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@tool(capability="shell", idempotent=False)
def keep(data: dict) -> dict:
    """Scripted side effect: records what it received and gives it back."""
    RECEIVED.append(data)
    return {"got": data}


class AwkwardArgs(Agent):
    """Scripted: a gated call with every awkward value in its arguments, then an answer."""

    model = ScriptedModel([tool_call("keep", data=AWKWARD), reply("Kept.")])
    permissions = "approve"
    tools = [keep]


class AwkwardReply(Agent):
    """Scripted: a final answer with NUL and a lone surrogate in it."""

    model = ScriptedModel([reply("the answer\x00with \udc80 in it")])


class BinaryReader(Agent):
    """Scripted: reads a binary file (allowed under read_only), then answers."""

    model = ScriptedModel([tool_call("read", path="blob.bin"), reply("Read it.")])
    sandbox = "local"
    permissions = "read_only"


class NulWriter(Agent):
    """Scripted: a gated write whose content holds NUL, then an answer."""

    model = ScriptedModel([tool_call("write", path="out.bin", content="a\x00b\x00"), reply("Written.")])
    sandbox = "local"
    permissions = "approve"


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"down": value}
    return value


class DeepArgs(Agent):
    """Scripted: arguments nested past SQLite's 1,000 levels."""

    model = ScriptedModel([tool_call("keep", data=nested(1100)), reply("never")])
    permissions = "approve"
    tools = [keep]


class LongIds(Agent):
    """Scripted: a provider whose tool call ids are 200 characters long."""

    model = ScriptedModel([tool_call("keep", data={}), reply("never")], call_ids="c" * 200 + "{index}")
    permissions = "approve"
    tools = [keep]


SCRIPTED = (AwkwardArgs, AwkwardReply, BinaryReader, NulWriter, DeepArgs, LongIds)


@pytest.fixture(autouse=True)
def fresh_models() -> Iterator[None]:
    for agent in SCRIPTED:
        agent.model.requests.clear()
    RECEIVED.clear()
    yield


@pytest.fixture
def deep_recursion() -> Iterator[None]:
    """The scripted model copies its script recursively (a real provider's ``json.loads`` is C
    and reads 1,100 levels at the default limit): give it the stack for that."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    yield
    sys.setrecursionlimit(limit)


def start(agent: type[Agent], how: str, **kwargs: Any) -> AgentRun:
    run = agent.run("go", **kwargs) if how == "run" else agent.run_later("go", **kwargs)
    run.refresh_from_db()
    return run


def assert_settled(run: AgentRun) -> None:
    """Never left running with a lease."""
    assert run.status != RunStatus.RUNNING
    assert (run.lease_owner, run.lease_expires_at) == (None, None)


# --- the codec -----------------------------------------------------------------------------------


def test_encoder_output_is_strict_json_without_nul_or_surrogates() -> None:
    text = json.dumps(AWKWARD, cls=StoredJSONEncoder)
    assert "\\u0000" not in text and "NaN" not in text and "Infinity" not in text
    text.encode("utf-8")  # no lone surrogate left
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


def test_codec_gives_back_every_value_exactly() -> None:
    back = json.loads(json.dumps(AWKWARD, cls=StoredJSONEncoder), cls=StoredJSONDecoder)
    assert same(back, AWKWARD), back


def test_values_that_need_nothing_are_stored_as_plain_json() -> None:
    value = {"path": "notes.txt", "n": [1, 2.5, 1e-7], "s": "é ✓ 😀 -0.05 e+"}
    assert json.dumps(value, cls=StoredJSONEncoder) == json.dumps(value, ensure_ascii=False)


def test_encoder_refuses_json_nested_deeper_than_the_limit_naming_it() -> None:
    json.dumps(nested(MAX_DEPTH - 1), cls=StoredJSONEncoder)
    with pytest.raises(UnstorableValue, match=f"more than {MAX_DEPTH} levels"):
        json.dumps(nested(MAX_DEPTH + 1), cls=StoredJSONEncoder)


def test_text_escape_round_trips_and_leaves_ordinary_text_alone() -> None:
    for text in ("plain 100%", "nul\x00", "\ud800", TEXT_MARK, TEXT_MARK + "%0000\x00"):
        stored = escape_text(text)
        assert "\x00" not in stored
        stored.encode("utf-8")
        assert unescape_text(stored) == text
    assert escape_text("plain 100%") == "plain 100%"


# --- durable runs: kept exactly ------------------------------------------------------------------


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_awkward_arguments_are_stored_shown_and_run_exactly(how: str) -> None:
    run = start(AwkwardArgs, how)
    assert run.status == RunStatus.SUSPENDED, run.error
    call = run.pending_calls().get()
    assert same(call.args["data"], AWKWARD)
    assert call.digest == args_digest({"data": AWKWARD})  # stable across the round trip
    call.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert len(RECEIVED) == 1 and same(RECEIVED[0], AWKWARD)
    assert same(ToolCall.objects.get(pk=call.pk).result, {"got": AWKWARD})
    requests = AwkwardArgs.model.requests
    assert len(requests) == 2  # once per turn
    sent_back = requests[1]["messages"]
    assert same(sent_back[-2]["tool_calls"][0]["args"], {"data": AWKWARD})  # the model's own call
    assert same(sent_back[-1]["content"], {"got": AWKWARD})


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_nul_and_surrogates_in_the_final_answer_are_kept(how: str) -> None:
    run = start(AwkwardReply, how)
    assert run.status == RunStatus.DONE, run.error
    assert run.result == "the answer\x00with \udc80 in it"
    assert run.transcript()[-1]["content"] == run.result
    assert len(AwkwardReply.model.requests) == 1
    assert_settled(run)


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_read_of_a_binary_file_is_kept_and_sent_back(how: str, tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x00\x01\x02\xff\xfe")
    run = start(BinaryReader, how, cwd=tmp_path)
    assert run.status == RunStatus.DONE, run.error
    result = run.transcript()[-2]["content"]
    assert "\x00\x00" in result["content"]
    requests = BinaryReader.model.requests
    assert len(requests) == 2
    assert requests[1]["messages"][-1]["content"] == result


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_nul_in_write_arguments_waits_and_writes_the_bytes(how: str, tmp_path: Path) -> None:
    run = start(NulWriter, how, cwd=tmp_path)
    assert run.status == RunStatus.SUSPENDED, run.error
    call = run.pending_calls().get()
    assert call.args == {"path": "out.bin", "content": "a\x00b\x00"}
    call.approve()
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error
    assert (tmp_path / "out.bin").read_bytes() == b"a\x00b\x00"
    assert len(NulWriter.model.requests) == 2


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
def test_awkward_values_read_back_through_the_orm_and_raw_rows_hold_none() -> None:
    run = AgentRun.objects.create(agent="x.Y", prompt="nul\x00 in the prompt", options={"v": AWKWARD})
    fresh = AgentRun.objects.get(pk=run.pk)
    assert fresh.prompt == "nul\x00 in the prompt"
    assert same(fresh.options, {"v": AWKWARD})
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT prompt, CAST(options AS TEXT) FROM {AgentRun._meta.db_table}")
        prompt, options = cursor.fetchone()
    assert "\x00" not in prompt and "\\u0000" not in options


# --- durable runs: refused at the edge, once -----------------------------------------------------


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_arguments_nested_past_the_limit_fail_the_run_once(how: str, deep_recursion: None) -> None:
    run = start(DeepArgs, how)
    assert run.status == RunStatus.FAILED
    assert f"more than {MAX_DEPTH} levels" in run.error and "UnstorableValue" in run.error
    assert_settled(run)
    assert len(DeepArgs.model.requests) == 1  # never asked again
    assert [m["role"] for m in run.transcript()] == ["user"]
    assert not ToolCall.objects.filter(run=run).exists()
    assert run.events.filter(type="failed").count() == 1


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_tool_call_ids_too_long_to_store_fail_the_run_once(how: str) -> None:
    run = start(LongIds, how)
    assert run.status == RunStatus.FAILED
    assert "tool call id of 201 characters" in run.error and "at most 128" in run.error
    assert_settled(run)
    assert len(LongIds.model.requests) == 1
    assert not ToolCall.objects.filter(run=run).exists()


class Refused(Agent):
    """Scripted: a final answer the test's trigger makes the database refuse."""

    model = ScriptedModel([reply("refuse-me, database")])


@pytest.fixture
def refusing_trigger() -> Iterator[None]:
    """A trigger that refuses any transcript row holding "refuse-me": a stand-in for whatever
    else a database may refuse (a constraint, a limit of its own)."""
    table = RunMessage._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION nexo_test_refuse() RETURNS trigger AS $$ BEGIN "
                "IF NEW.data::text LIKE '%refuse-me%' THEN "
                "RAISE EXCEPTION 'refused by the test trigger' USING ERRCODE = '22000'; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(f"CREATE TRIGGER nexo_test_refuse BEFORE INSERT ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION nexo_test_refuse()")
        else:
            cursor.execute(
                f"CREATE TRIGGER nexo_test_refuse BEFORE INSERT ON {table} WHEN NEW.data LIKE '%refuse-me%' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
            )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TRIGGER nexo_test_refuse{' ON ' + table if connection.vendor == 'postgresql' else ''}")
        if connection.vendor == "postgresql":
            cursor.execute("DROP FUNCTION nexo_test_refuse()")


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["run", "run_later"])
def test_scripted_reply_the_database_refuses_fails_the_run_once_with_the_cause(
    how: str, refusing_trigger: None
) -> None:
    Refused.model.requests.clear()
    run = start(Refused, how)
    assert run.status == RunStatus.FAILED
    assert "the database refused" in run.error and "refused by the test trigger" in run.error
    assert_settled(run)
    assert len(Refused.model.requests) == 1  # not asked again after a lease
    assert [m["role"] for m in run.transcript()] == ["user"]


# --- floats jsonb gives back differently: the digest and the page --------------------------------


@tool(capability="shell", idempotent=False)
def scale(factor: float, offset: float) -> dict:
    """Scripted side effect with number parameters: records what it received."""
    RECEIVED.append((factor, offset))
    return {"scaled": True}


class Scaler(Agent):
    """Scripted: a gated call with floats PostgreSQL's jsonb writes differently, then an answer."""

    model = ScriptedModel([tool_call("scale", factor=1e16, offset=-0.0), reply("Scaled.")])
    permissions = "approve"
    tools = [scale]


@pytest.mark.durable
@pytest.mark.django_db(transaction=True)
def test_scripted_approved_float_call_runs_with_the_floats_the_page_showed() -> None:
    from tests.admin.support import approver, client_for, csrf_post, decision_url, page_digest

    Scaler.model.requests.clear()
    run = Scaler.run("scale it")
    call = run.pending_calls().get()
    assert call.digest == args_digest({"factor": 1e16, "offset": -0.0})
    client = client_for(approver())
    html = client.get(decision_url(call)).content.decode()
    assert "1e+16" in html and "-0.0" in html  # what the model sent, not 10000000000000000 / 0.0
    response = csrf_post(client, decision_url(call), {"action": "approve", "digest": page_digest(html)})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.DONE, run.error  # not "SecurityError: ... is a different call"
    assert [(repr(f), repr(o)) for f, o in RECEIVED] == [("1e+16", "-0.0")]
    assert len(Scaler.model.requests) == 2
