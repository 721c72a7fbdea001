"""``nexo_django.Workflow``: durable multi-step work with agents and people inside.

A subclass implements ``call(self, payload)``. Its steps are functions with names, recorded once
(as DBOS's ``@DBOS.step`` and Temporal's activities are): ``checkpoint`` stores a function's JSON
result, ``run_agent`` an agent run's final answer, ``ask`` a person's answer. ``call`` runs again
from the top on every pass (after each suspension, after a crash); a step already recorded
returns what was stored without running again. See docs/workflows.md.

Importing this module touches no database (``from nexo_django import Workflow`` works while Django
loads its apps); the durable entry points reach :mod:`nexo_django.durable.workflow_runs` when called.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..core.agent import FROM_SETTINGS
from ..core.errors import WorkflowError

if TYPE_CHECKING:
    from ..core.sandboxes import Sandbox
    from .workflow_runs import WorkflowRun


class Pass(Protocol):
    """What a pass of a run gives its workflow (``workflow_runs.Pass``)."""

    workspace: Sandbox

    def checkpoint(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...
    def run_agent(self, agent_class: type, prompt: str, name: str | None, options: dict[str, Any]) -> str: ...
    def ask(self, key: str, question: str, schema: dict[str, Any] | None) -> Any: ...


class Workflow:
    """Declare a workflow by subclassing and implementing :meth:`call`."""

    #: where staged files and the agents inside act: "virtual" (in memory, saved with each step)
    #: or "local" (the ``cwd`` given to ``run``/``run_later``)
    sandbox: Any = "virtual"
    #: how long a question waits for an answer (a ``timedelta``, seconds, or None: forever);
    #: by default ``NEXO["APPROVAL_TIMEOUT"]``, as for an agent's calls
    approval_timeout: Any = FROM_SETTINGS

    def __init__(self, pass_: Pass | None = None) -> None:
        self._pass = pass_

    def call(self, payload: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement call(self, payload)")

    # Steps ---------------------------------------------------------------------------------------

    def _current(self, what: str) -> Pass:
        if self._pass is None:
            raise WorkflowError(
                f"{type(self).__name__}.{what}() runs inside a durable run: start one with "
                f"{type(self).__name__}.run(payload) or .run_later(payload)"
            )
        return self._pass

    def checkpoint(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once and store its JSON result under ``name``; on every later
        pass return the stored result without calling ``fn``. A crash while ``fn`` runs (before
        its result is stored) runs it again: make it idempotent."""
        return self._current("checkpoint").checkpoint(name, fn, args, kwargs)

    def run_agent(self, agent_class: type, prompt: str, *, name: str | None = None, **options: Any) -> str:
        """Run ``agent_class`` on ``prompt`` as a durable agent run of this workflow and return its
        final text. While it waits for a decision the workflow is ``suspended``; its calls are in
        the approval inbox. ``name`` (default: the agent class's name, numbered when repeated)
        names the step; ``options`` are the agent's (``cwd``, ``permissions``, ``model``, ...)."""
        return self._current("run_agent").run_agent(agent_class, prompt, name, options)

    def ask(self, key: str, question: str, schema: dict[str, Any] | None = None) -> Any:
        """A person's answer to ``question`` (JSON, validated against ``schema`` when given); the
        run suspends until there is one. Raises ``NoAnswer`` if it expired unanswered."""
        return self._current("ask").ask(key, question, schema)

    @property
    def workspace(self) -> Sandbox:
        """The workflow's sandbox. Change files inside a step's function only: code outside
        steps runs again on every pass."""
        return self._current("workspace").workspace

    # Durable runs --------------------------------------------------------------------------------

    @classmethod
    def path(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"

    @classmethod
    def run(cls, payload: Any = None, user: Any = None, **options: Any) -> WorkflowRun:
        """Durable, synchronous: runs now in this process until it finishes or waits."""
        return _runs().start_workflow(cls, payload, user=user, later=False, **options)

    @classmethod
    def run_later(cls, payload: Any = None, user: Any = None, *, at: datetime | None = None,
                  **options: Any) -> WorkflowRun:
        """Durable, enqueued when the current transaction commits; with ``at`` (an aware
        datetime), its job waits in rq's scheduler until then (docs/schedules.md)."""
        return _runs().start_workflow(cls, payload, user=user, later=True, at=at, **options)


def _runs() -> Any:
    # Imported when called: workflow_runs imports the models, which cannot load before Django has.
    from . import workflow_runs

    return workflow_runs
