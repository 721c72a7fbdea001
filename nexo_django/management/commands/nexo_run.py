from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import import_string

from nexo_django.durable.agent import Agent


class Command(BaseCommand):
    help = "Start a durable run of an agent: nexo_run app.agents.Scribe 'prompt' [--cwd DIR] [--later]"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent", help="Dotted path of the Agent class.")
        parser.add_argument("prompt")
        parser.add_argument("--cwd", default=None)
        parser.add_argument("--permissions", default=None, help="A mode name overriding the class's.")
        parser.add_argument("--later", action="store_true", help="Enqueue instead of running here.")

    def handle(self, *args: Any, agent: str, prompt: str, cwd: str | None, permissions: str | None,
               later: bool, **options: Any) -> None:
        try:
            cls = import_string(agent)
        except ImportError as exc:
            raise CommandError(f"cannot import {agent!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Agent)):
            raise CommandError(f"{agent!r} is not an Agent subclass")
        kwargs: dict[str, Any] = {}
        if cwd is not None:
            kwargs["cwd"] = cwd
        if permissions is not None:
            kwargs["permissions"] = permissions
        run = (cls.run_later if later else cls.run)(prompt, **kwargs)
        self.stdout.write(f"run {run.pk}: {run.status}")
        for call in run.pending_calls():
            self.stdout.write(f"  pending: {call.name} {call.args}")
        if run.result:
            self.stdout.write(run.result)
