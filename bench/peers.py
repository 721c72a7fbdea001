"""Benchmark 5: the approval cycle in peer frameworks, beside nexo_django's, in one process.

The same scenario everywhere: a fake model asks for one gated ``write(path, content)`` of a small
file; the framework pauses for approval with its state persisted durably (a SQLite commit in WAL
mode with ``synchronous=FULL``, i.e. an fsync of the WAL); the call is approved; the run resumes
from the stored state; the write runs; the fake model gives its final answer; the final state is
persisted. One cycle is timed end to end.

``--peer-db postgres`` moves every peer's store to PostgreSQL with fsync on (checked:
``SHOW fsync`` and ``SHOW synchronous_commit`` both ``on``), the server nexo's ``postgres`` cycle
uses in that run, one fresh database per peer: LangGraph with its own ``PostgresSaver``
(``langgraph-checkpoint-postgres``), the other two with their state in one row of a table,
committed (one WAL flush) at every ``put``. The default, ``sqlite-wal-full``, keeps them on
SQLite WAL+FULL as below.

- ``langgraph``: a ``StateGraph`` (model node → tools node → model node) compiled with
  ``SqliteSaver`` on a file (``setup()`` puts it in WAL; we set ``synchronous=FULL``);
  ``interrupt()`` in the tools node pauses, ``Command(resume=...)`` resumes; every checkpoint
  and pending write is committed by the saver (``durability="sync"`` by default here: each
  checkpoint is durable before the next step runs, like nexo's ``executing`` mark).
- ``pydantic_ai``: ``Agent(FunctionModel(...), output_type=[str, DeferredToolRequests])`` with
  a ``requires_approval=True`` tool; the message history is serialised
  (``ModelMessagesTypeAdapter``) into a SQLite WAL+FULL row at the pause, read back, and the
  run resumed with ``DeferredToolResults`` approving the call; the final history is stored too.
- ``openai_agents`` (when installed): a ``Model`` subclass as the fake model and a
  ``needs_approval=True`` function tool; ``result.to_state().to_string()`` is stored at the pause,
  read back with ``RunState.from_string``, approved, resumed with ``Runner.run``; the final
  state is stored too.
- ``nexo_django``: ``bench.approval_cycle.one_cycle`` (``VirtualScribe``) on ``--nexo-db``.

Fake models do no work of their own, so what is timed is each framework's loop, its
serialisation and its durable writes. The frameworks take turns in rounds (``--round`` cycles
each), so a burst of load on a shared machine falls on all of them alike.

    python -m bench.peers [--cycles N] [--nexo-db sqlite-wal-full|postgres|none] [--framework NAME ...]
                          [--peer-db sqlite-wal-full|postgres] [--processes N]

``--processes N`` runs the whole comparison N times, each in a fresh process, one after the other,
and reports the median of their figures beside the lowest and highest ratio: the ratio moves from
one process to the next by more than the rounds inside one process can even out (on the 2-core
machine of bench/README.md, 0.41 to 0.54 in 17 runs of one revision).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sqlite3
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import (
    DATABASES,
    database_url,
    db_label,
    figure,
    fmt,
    median,
    ms,
    note,
    p95,
    postgres_url,
    scratch,
    setup_django,
)

WARMUP = 10
COUNTED = 3
PROMPT = "Write 'hi' to notes.txt"
SQLITE_FULL = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL")
#: ``--peer-db``: where the peers keep their state, and the label it has in the figures (the
#: same label bench.common.db_label gives nexo's database; PostgreSQL's is checked on the server)
PEER_DBS = {"sqlite-wal-full": "sqlite-wal-full", "postgres": "postgresql-fsync"}


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def open_sqlite(path: Path) -> sqlite3.Connection:
    """A connection in WAL with synchronous=FULL (checked), commits counted in ``.commits``."""
    conn = sqlite3.connect(path, check_same_thread=False)
    for pragma in SQLITE_FULL:
        conn.execute(pragma)
    mode, sync = conn.execute("PRAGMA journal_mode").fetchone()[0], conn.execute("PRAGMA synchronous").fetchone()[0]
    if (mode, sync) != ("wal", 2):
        raise RuntimeError(f"{path}: journal_mode={mode} synchronous={sync}, wanted wal and 2 (FULL)")
    return conn


class CommitCounter:
    """Counts the COMMITs SQLite runs on a connection (each one an fsync of the WAL)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.count = 0
        conn.set_trace_callback(self._trace)

    def _trace(self, statement: str) -> None:
        if statement.lstrip()[:6].upper() == "COMMIT":
            self.count += 1


def open_postgres(url: str, **options: Any) -> Any:
    """A psycopg connection (``options`` passed on) to a server whose every commit waits for its
    WAL flush: ``fsync`` and ``synchronous_commit`` on (checked, as ``open_sqlite`` checks its
    pragmas), so a commit there is as durable as a SQLite WAL+FULL one."""
    import psycopg
    from psycopg.rows import tuple_row

    conn = psycopg.connect(url, **options)
    settings = {}
    with conn.cursor(row_factory=tuple_row) as cursor:
        for name in ("fsync", "synchronous_commit"):
            row = cursor.execute(f"SHOW {name}").fetchone()
            settings[name] = row[0] if row else None
    if not conn.autocommit:
        conn.rollback()
    if settings != {"fsync": "on", "synchronous_commit": "on"}:
        conn.close()
        raise RuntimeError(f"{url}: {settings}, wanted fsync and synchronous_commit on")
    return conn


class TransactionIds:
    """Counts the transactions that wrote on a PostgreSQL server, from its transaction-id counter
    (``pg_current_snapshot()``'s xmax, read on a connection of its own: reading takes none): each
    transaction that writes takes one id, and with ``synchronous_commit`` on its COMMIT waits for
    its WAL flush, the analogue of a SQLite WAL+FULL COMMIT's fsync. Read-only transactions take
    none. The counter is the whole server's: read it only while nothing else writes there (the
    frameworks take turns in one process)."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)

    @property
    def count(self) -> int:
        row = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return int(row[0])


class StateStore:
    """Where a framework without a store of its own keeps its paused state: one row per run in a
    SQLite file, WAL + synchronous=FULL, committed (so fsynced) at every ``put``."""

    def __init__(self, path: Path) -> None:
        self.conn = open_sqlite(path)
        self.conn.isolation_level = None  # explicit transactions below
        self.conn.execute("CREATE TABLE IF NOT EXISTS run_state (id TEXT PRIMARY KEY, state BLOB NOT NULL)")
        self.commits = CommitCounter(self.conn)

    def put(self, key: str, state: bytes | str) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT OR REPLACE INTO run_state (id, state) VALUES (?, ?)", (key, state))
        self.conn.execute("COMMIT")

    def get(self, key: str) -> Any:
        row = self.conn.execute("SELECT state FROM run_state WHERE id = ?", (key,)).fetchone()
        if row is None:
            raise KeyError(key)
        return row[0]


class PostgresStateStore:
    """``StateStore`` on PostgreSQL (``--peer-db postgres``): one row per run in a table, on a
    psycopg connection with autocommit off, one transaction per ``put`` (the upsert, then COMMIT:
    one WAL flush); ``get`` reads in a transaction of its own, ended at once (it writes nothing,
    so its commit flushes nothing). The state is kept as text (both frameworks' is JSON)."""

    def __init__(self, url: str) -> None:
        self.conn = open_postgres(url)
        self.conn.execute("CREATE TABLE IF NOT EXISTS run_state (id text PRIMARY KEY, state text NOT NULL)")
        self.conn.commit()
        self.commits = TransactionIds(url)

    def put(self, key: str, state: bytes | str) -> None:
        text = state.decode() if isinstance(state, bytes) else state
        self.conn.execute(
            "INSERT INTO run_state (id, state) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state",
            (key, text),
        )
        self.conn.commit()

    def get(self, key: str) -> Any:
        row = self.conn.execute("SELECT state FROM run_state WHERE id = %s", (key,)).fetchone()
        self.conn.commit()
        if row is None:
            raise KeyError(key)
        return row[0]


class RowStatePeer:
    """A framework without a store of its own: its state in one row of :class:`StateStore` (a
    SQLite file in its workdir) or, with ``--peer-db postgres``, of :class:`PostgresStateStore`
    (a fresh database on the benchmark's PostgreSQL), its ``store`` label saying which."""

    store = ""

    def use_state_store(self, workdir: Path, peer_db: str) -> None:
        self.state: StateStore | PostgresStateStore
        if peer_db == "postgres":
            self.state = PostgresStateStore(postgres_url())
            self.store = self.store.replace("sqlite_row_wal_full", "postgresql_row_fsync")
        else:
            self.state = StateStore(workdir / "state.sqlite3")


class Peer(ABC):
    name = ""
    dist = ""
    store = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.files = workdir / "files"
        self.files.mkdir()

    @property
    def version(self) -> str:
        return version_of(self.dist)

    @abstractmethod
    def cycle(self, i: int) -> None:
        """One approval cycle, from start to the final state committed."""

    @abstractmethod
    def commits(self) -> int:
        """COMMITs run on the peer's store so far."""

    def check(self, i: int, final: str) -> None:
        if final != "Done.":
            raise RuntimeError(f"{self.name}: final answer {final!r}")
        if (self.files / f"notes-{i}.txt").read_text() != "hi":
            raise RuntimeError(f"{self.name}: the approved write did not land")

    def write(self, path: str, content: str) -> str:
        """The gated tool: a small file, written plainly (no fsync), the same in every peer."""
        (self.files / path).write_text(content)
        return f"wrote {len(content)} bytes to {path}"


class LangGraphPeer(Peer):
    name = "langgraph"
    dist = "langgraph"

    def __init__(self, workdir: Path, durability: str = "sync", peer_db: str = "sqlite-wal-full") -> None:
        super().__init__(workdir)
        from typing import Annotated, TypedDict

        from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages
        from langgraph.types import Command, interrupt

        self.Command = Command
        self.durability = durability
        peer = self

        # The functional form: its types are objects, not strings this module's globals lack.
        State = TypedDict("State", {"messages": Annotated[list[AnyMessage], add_messages], "cycle": int})  # noqa: UP013

        def model(state: Any) -> dict[str, Any]:  # the fake model: a node, no chat-model wrapper
            if isinstance(state["messages"][-1], ToolMessage):
                return {"messages": [AIMessage("Done.")]}
            call = {"name": "write", "args": {"path": f"notes-{state['cycle']}.txt", "content": "hi"}, "id": "call_1"}
            return {"messages": [AIMessage("", tool_calls=[call])]}

        def tools(state: Any) -> dict[str, Any]:
            results = []
            for call in state["messages"][-1].tool_calls:  # type: ignore[union-attr]
                decision = interrupt({"tool": call["name"], "args": call["args"], "id": call["id"]})
                content = peer.write(**call["args"]) if decision.get("approved") else "denied"
                results.append(ToolMessage(content, tool_call_id=call["id"]))
            return {"messages": results}

        def route(state: Any) -> str:
            return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

        graph = StateGraph(State)
        graph.add_node("model", model)
        graph.add_node("tools", tools)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", route, ["tools", END])
        graph.add_edge("tools", "model")
        self.counter: CommitCounter | TransactionIds
        if peer_db == "postgres":
            self.store = f"PostgresSaver_fsync_durability={durability}"
            self.app = graph.compile(checkpointer=self._postgres_saver())
        else:
            self.store = f"SqliteSaver_file_wal_full_durability={durability}"
            self.app = graph.compile(checkpointer=self._sqlite_saver(workdir))

    def _sqlite_saver(self, workdir: Path) -> Any:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = open_sqlite(workdir / "checkpoints.sqlite3")
        self.counter = CommitCounter(conn)
        saver = SqliteSaver(conn)
        saver.setup()  # sets journal_mode=WAL again; synchronous stays FULL (per connection)
        if conn.execute("PRAGMA synchronous").fetchone()[0] != 2:
            raise RuntimeError("SqliteSaver changed synchronous")
        return saver

    def _postgres_saver(self) -> Any:
        """LangGraph's own PostgreSQL checkpointer on a fresh database, its connection opened as
        ``PostgresSaver.from_conn_string`` opens it (autocommit, ``prepare_threshold=0``, dict
        rows): each checkpoint and each batch of pending writes is one transaction of the saver."""
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        url = postgres_url()
        saver = PostgresSaver(open_postgres(url, autocommit=True, prepare_threshold=0, row_factory=dict_row))
        saver.setup()
        self.counter = TransactionIds(url)
        return saver

    def cycle(self, i: int) -> None:
        from langchain_core.messages import HumanMessage

        config: Any = {"configurable": {"thread_id": f"run-{i}"}}
        paused = self.app.invoke({"messages": [HumanMessage(PROMPT)], "cycle": i}, config, durability=self.durability)
        if not paused.get("__interrupt__"):
            raise RuntimeError("langgraph: the run did not pause for approval")
        done = self.app.invoke(self.Command(resume={"approved": True}), config, durability=self.durability)
        self.check(i, done["messages"][-1].content)

    def commits(self) -> int:
        return self.counter.count


class PydanticAIPeer(RowStatePeer, Peer):
    name = "pydantic_ai"
    dist = "pydantic-ai-slim"
    store = "history_json_in_sqlite_row_wal_full"

    def __init__(self, workdir: Path, loop: asyncio.AbstractEventLoop, peer_db: str = "sqlite-wal-full") -> None:
        super().__init__(workdir)
        from pydantic_ai import (
            Agent,
            DeferredToolRequests,
            DeferredToolResults,
            ModelMessagesTypeAdapter,
        )
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel

        self.loop = loop
        self.adapter = ModelMessagesTypeAdapter
        self.DeferredToolRequests = DeferredToolRequests
        self.DeferredToolResults = DeferredToolResults
        self.use_state_store(workdir, peer_db)
        self.current = 0

        def fake(messages: list[Any], info: AgentInfo) -> ModelResponse:
            if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
                return ModelResponse(parts=[TextPart("Done.")])
            args = {"path": f"notes-{self.current}.txt", "content": "hi"}
            return ModelResponse(parts=[ToolCallPart("write", args, tool_call_id="call_1")])

        self.agent = Agent(FunctionModel(fake), output_type=[str, DeferredToolRequests])
        self.agent.tool_plain(name="write", requires_approval=True)(self.write_tool)

    def write_tool(self, path: str, content: str) -> str:
        """Write a small file."""
        return self.write(path, content)

    async def _cycle(self, i: int) -> str:
        self.current = i
        key = f"run-{i}"
        paused = await self.agent.run(PROMPT)
        if not isinstance(paused.output, self.DeferredToolRequests):
            raise RuntimeError(f"pydantic_ai: expected deferred tool requests, got {paused.output!r}")
        self.state.put(key, self.adapter.dump_json(paused.all_messages()))
        # The approver's side: the stored state is all it has.
        history = self.adapter.validate_json(self.state.get(key))
        last = history[-1]
        approvals = {part.tool_call_id: True for part in last.parts if getattr(part, "part_kind", "") == "tool-call"}
        done = await self.agent.run(message_history=history, deferred_tool_results=self.DeferredToolResults(approvals=approvals))
        self.state.put(key, self.adapter.dump_json(done.all_messages()))
        return str(done.output)

    def cycle(self, i: int) -> None:
        self.check(i, self.loop.run_until_complete(self._cycle(i)))

    def commits(self) -> int:
        return self.state.commits.count


class OpenAIAgentsPeer(RowStatePeer, Peer):
    name = "openai_agents"
    dist = "openai-agents"
    store = "RunState_json_in_sqlite_row_wal_full"

    def __init__(self, workdir: Path, loop: asyncio.AbstractEventLoop, peer_db: str = "sqlite-wal-full") -> None:
        super().__init__(workdir)
        from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )

        set_tracing_disabled(True)  # no exporter, no network
        self.loop = loop
        self.Runner = Runner
        self.RunState = RunState
        self.use_state_store(workdir, peer_db)
        self.current = 0
        peer = self

        def kind(item: Any) -> Any:
            return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)

        class FakeModel(Model):
            async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
                items = input if isinstance(input, list) else []
                if items and kind(items[-1]) == "function_call_output":
                    text = ResponseOutputText(type="output_text", text="Done.", annotations=[])
                    output: list[Any] = [ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                                               status="completed", content=[text])]  # fmt: skip
                else:
                    args = json.dumps({"path": f"notes-{peer.current}.txt", "content": "hi"})
                    output = [ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1",
                                                       name="write", arguments=args, status="completed")]  # fmt: skip
                return ModelResponse(output=output, usage=Usage(), response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError("the benchmark does not stream")

        @function_tool(needs_approval=True)
        def write(path: str, content: str) -> str:
            """Write a small file."""
            return peer.write(path, content)

        self.agent = Agent(name="scribe", instructions="You write notes.", model=FakeModel(), tools=[write])

    async def _cycle(self, i: int) -> str:
        self.current = i
        key = f"run-{i}"
        paused = await self.Runner.run(self.agent, PROMPT)
        if not paused.interruptions:
            raise RuntimeError("openai_agents: the run did not pause for approval")
        self.state.put(key, paused.to_state().to_string())
        state = await self.RunState.from_string(self.agent, self.state.get(key))
        for item in state.get_interruptions():
            state.approve(item)
        done = await self.Runner.run(self.agent, state)
        self.state.put(key, done.to_state().to_string())
        return str(done.final_output)

    def cycle(self, i: int) -> None:
        self.check(i, self.loop.run_until_complete(self._cycle(i)))

    def commits(self) -> int:
        return self.state.commits.count


class NexoPeer(Peer):
    name = "nexo_django"
    dist = "nexo-django"

    def __init__(self, workdir: Path, db: str) -> None:
        super().__init__(workdir)
        setup_django(database_url(db))
        from django.contrib.auth import get_user_model

        from bench.agents import VirtualScribe

        self.agent = VirtualScribe
        self.user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench")
        self.store = db_label()

    def cycle(self, i: int) -> None:
        from bench.approval_cycle import one_cycle

        one_cycle(self.agent, None, self.user)

    def commits(self) -> int:
        return -1  # counted by bench.approval_cycle (write_transactions)


FRAMEWORKS = ("langgraph", "pydantic_ai", "openai_agents")
PEER_DISTS = {"langgraph": "langgraph-checkpoint-sqlite", "pydantic_ai": "pydantic-ai-slim",
              "openai_agents": "openai-agents"}  # fmt: skip
#: ... and with ``--peer-db postgres``
PEER_DISTS_POSTGRES = {**PEER_DISTS, "langgraph": "langgraph-checkpoint-postgres"}


def make_peers(
    names: list[str], root: Path, loop: asyncio.AbstractEventLoop, durability: str, peer_db: str = "sqlite-wal-full"
) -> list[Peer]:
    makers: dict[str, Callable[[Path], Peer]] = {
        "langgraph": lambda d: LangGraphPeer(d, durability, peer_db),
        "pydantic_ai": lambda d: PydanticAIPeer(d, loop, peer_db),
        "openai_agents": lambda d: OpenAIAgentsPeer(d, loop, peer_db),
    }
    dists = PEER_DISTS_POSTGRES if peer_db == "postgres" else PEER_DISTS
    peers = []
    for name in names:
        if version_of(dists[name]) == "absent":
            note(f"{name} is not installed (pip install -e '.[bench]'): skipped")
            continue
        directory = root / name
        directory.mkdir()
        peers.append(makers[name](directory))
    return peers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--round", type=int, default=25, help="cycles per framework before the next one's turn")
    parser.add_argument("--framework", action="append", choices=FRAMEWORKS, dest="frameworks")
    parser.add_argument("--nexo-db", default="sqlite-wal-full", choices=[*DATABASES, "none"],
                        help="the database of nexo_django's cycle, timed in the same rounds (none: peers only)")
    parser.add_argument("--peer-db", default="sqlite-wal-full", choices=list(PEER_DBS),
                        help="where the peers keep their state: SQLite WAL+FULL files, or PostgreSQL with fsync on "
                             "(the server of nexo's postgres cycle)")
    parser.add_argument("--langgraph-durability", default="sync", choices=["sync", "async", "exit"])
    parser.add_argument("--no-freeze", action="store_true", help="leave the set-up objects to the collector")
    parser.add_argument("--processes", type=int, default=1, help="run it in N fresh processes and take the medians")
    args = parser.parse_args()
    if args.processes > 1:
        return in_processes(args.processes)

    root = scratch() / "peers"
    root.mkdir()
    loop = asyncio.new_event_loop()
    peers = make_peers(args.frameworks or list(FRAMEWORKS), root, loop, args.langgraph_durability, args.peer_db)
    if not peers:
        raise SystemExit("no peer framework is installed: pip install -e '.[bench]'")
    if args.nexo_db != "none":
        (root / "nexo").mkdir()
        peers.append(NexoPeer(root / "nexo", args.nexo_db))

    counter = iter(range(10**9))
    commits: dict[str, float] = {}
    for peer in peers:
        for _ in range(WARMUP):
            peer.cycle(next(counter))
        counted = []
        # The fewest of COUNTED cycles: on PostgreSQL the count is the server's (TransactionIds),
        # where an autovacuum's analyze could add one.
        for _ in range(COUNTED):
            before = peer.commits()
            peer.cycle(next(counter))
            counted.append(peer.commits() - before)
        commits[peer.name] = min(counted)

    if not args.no_freeze:
        # Every framework's modules and objects live in this one heap: freeze them out of the
        # collector, so a full collection during one framework's cycle does not walk the others'.
        gc.collect()
        gc.freeze()
    wall: dict[str, list[int]] = {p.name: [] for p in peers}
    cpu: dict[str, list[int]] = {p.name: [] for p in peers}
    done = 0
    while done < args.cycles:
        size = min(args.round, args.cycles - done)
        for peer in peers:
            for _ in range(size):
                i = next(counter)
                start, start_cpu = time.perf_counter_ns(), time.process_time_ns()
                peer.cycle(i)
                cpu[peer.name].append(time.process_time_ns() - start_cpu)
                wall[peer.name].append(time.perf_counter_ns() - start)
        done += size

    medians: dict[str, float] = {}
    for peer in peers:
        medians[peer.name] = ms(median(wall[peer.name]))
        if isinstance(peer, NexoPeer):
            continue
        figure(
            "peer_cycle", framework=peer.name, version=peer.version, store=peer.store, cycles=args.cycles,
            median_ms=medians[peer.name], p95_ms=ms(p95(wall[peer.name])), cpu_median_ms=ms(median(cpu[peer.name])),
            commits_per_cycle=commits[peer.name],
        )  # fmt: skip
    nexo = next((p for p in peers if isinstance(p, NexoPeer)), None)
    if nexo is None:
        return
    figure(
        "peer_cycle", framework=nexo.name, version=nexo.version, store=nexo.store, cycles=args.cycles,
        median_ms=medians[nexo.name], p95_ms=ms(p95(wall[nexo.name])), cpu_median_ms=ms(median(cpu[nexo.name])),
    )  # fmt: skip
    best = min((p for p in peers if p is not nexo), key=lambda p: medians[p.name])
    # The peers' database is named only where it is not the SQLite of the existing figures.
    peer_db = {"peer_db": PEER_DBS[args.peer_db]} if args.peer_db != "sqlite-wal-full" else {}
    figure(
        "cycle_vs_best_peer", nexo_db=nexo.store, **peer_db, nexo_median_ms=medians[nexo.name], best_peer=best.name,
        best_peer_median_ms=medians[best.name], ratio=medians[nexo.name] / medians[best.name],
        # CPU alone: what is left when the fsyncs (slow and shared on a busy machine) are not counted.
        cpu_ratio=median(cpu[nexo.name]) / median(cpu[best.name]),
    )  # fmt: skip
    print_verdict(nexo.store, best.name, fmt(medians[nexo.name] / medians[best.name]), peer_db.get("peer_db"))
    note(f"one process, frameworks in turn; load average {'/'.join(f'{v:.2f}' for v in os.getloadavg())}")


def print_verdict(nexo_db: str, best_peer: str, ratio: str, peer_db: str | None = None) -> None:
    """The same verdict bench/run.py prints for this ratio (``peer_db``: as in the figure, absent
    for the peers on SQLite)."""
    from bench.targets import evaluate

    judged = {"figure": "cycle_vs_best_peer", "nexo_db": nexo_db, "best_peer": best_peer, "ratio": ratio}
    for verdict in evaluate([{**judged, **({"peer_db": peer_db} if peer_db else {})}]):
        if verdict.startswith("target=cycle_vs_best_peer") and "not_measured" not in verdict:
            print(verdict, flush=True)


def in_processes(count: int) -> None:
    """Run this benchmark ``count`` times, each in a fresh process with the same arguments; print
    each process's figures (as ``peer_cycle_process`` and ``cycle_vs_best_peer_process``, with
    ``process=i``), then ``peer_cycle`` and ``cycle_vs_best_peer`` with the medians over the
    processes and the lowest and highest ratio."""
    from bench.targets import parse

    argv: list[str] = []  # this command's arguments without --processes
    skip = False
    for arg in sys.argv[1:]:
        if not skip and not arg.startswith("--processes"):
            argv.append(arg)
        skip = arg == "--processes"
    runs: list[list[dict[str, str]]] = []
    for i in range(count):
        done = subprocess.run([sys.executable, "-m", "bench.peers", *argv], stdout=subprocess.PIPE, text=True, check=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("figure=")]
        for line in lines:
            name, rest = line.split(" ", 1)
            print(f"{name}_process process={i} {rest}", flush=True)
        runs.append(parse(lines))

    def mid(rows: list[dict[str, str]], key: str) -> float:
        return median([float(r[key]) for r in rows])

    peer_rows: dict[str, list[dict[str, str]]] = {}
    for figures in runs:
        for f in figures:
            if f["figure"] == "peer_cycle":
                peer_rows.setdefault(f["framework"], []).append(f)
    for framework, rows in peer_rows.items():
        extra = {"commits_per_cycle": rows[0]["commits_per_cycle"]} if "commits_per_cycle" in rows[0] else {}
        figure(
            "peer_cycle", framework=framework, version=rows[0]["version"], store=rows[0]["store"],
            cycles=rows[0]["cycles"], processes=len(rows), median_ms=mid(rows, "median_ms"),
            p95_ms=mid(rows, "p95_ms"), cpu_median_ms=mid(rows, "cpu_median_ms"), **extra,
        )  # fmt: skip
    ratios = [f for figures in runs for f in figures if f["figure"] == "cycle_vs_best_peer"]
    if not ratios:
        return
    best = Counter(r["best_peer"] for r in ratios).most_common(1)[0][0]
    ratio = mid(ratios, "ratio")
    peer_db = {"peer_db": ratios[0]["peer_db"]} if "peer_db" in ratios[0] else {}
    figure(
        "cycle_vs_best_peer", nexo_db=ratios[0]["nexo_db"], **peer_db, processes=len(ratios),
        nexo_median_ms=mid(ratios, "nexo_median_ms"), best_peer=best,
        best_peer_median_ms=mid(ratios, "best_peer_median_ms"), ratio=ratio,
        ratio_min=min(float(r["ratio"]) for r in ratios), ratio_max=max(float(r["ratio"]) for r in ratios),
        cpu_ratio=mid(ratios, "cpu_ratio"),
    )  # fmt: skip
    print_verdict(ratios[0]["nexo_db"], best, fmt(ratio), peer_db.get("peer_db"))


if __name__ == "__main__":
    main()
