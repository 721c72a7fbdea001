"""What the models' methods do (:class:`nexo_django.models.Operations`): the durable layer's
decisions and transitions, and its prepared reads. ``apps.NexoDjangoConfig.ready()`` installs it;
the models reach it through ``models.operations()`` and so import nothing from this layer."""

from __future__ import annotations

from typing import Any

from django.db import models

from ..models import AgentRun, ToolCall
from . import conversations, prefix, runs, sql
from .fixed import PENDING_APPROVAL


class DurableOperations:
    decide = staticmethod(runs.decide)
    decide_all = staticmethod(runs.decide_all)
    cancel_run = staticmethod(runs.cancel_run)
    retry_run = staticmethod(runs.retry_run)
    resolve_unknown = staticmethod(runs.resolve_unknown)
    follow_up = staticmethod(conversations.follow_up)
    conversation = staticmethod(prefix.conversation)

    @staticmethod
    def refresh(obj: models.Model, alias: str) -> None:
        sql.refresh(obj, alias)

    @staticmethod
    def pending_rows(run: AgentRun, *, limit: int | None, alias: str) -> list[ToolCall]:
        """The run's pending calls, oldest first, each with its run cached on it."""
        rows = sql.select(
            ToolCall, order_by=("created_at", "id"), limit=limit, alias=alias,
            run=run.pk, status=PENDING_APPROVAL,
        )  # fmt: skip
        relation: Any = ToolCall._meta.get_field("run")
        for row in rows:
            relation.set_cached_value(row, run)
        return rows
