"""Agents of the benchmarks, importable by worker processes. Every model here is scripted."""

from __future__ import annotations

from tests.durable_agents import Scribe


class VirtualScribe(Scribe):
    """Scribe (a scripted gated write, then an answer) on the in-memory sandbox: no disk I/O in
    the tool, so the cycle measures the durable layer alone."""

    sandbox = "virtual"
