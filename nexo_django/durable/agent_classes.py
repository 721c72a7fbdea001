"""Agent classes by the dotted path a run stores: imported, or else defined in this process.

A run stores its agent's dotted path (``Agent.path()``), and whatever continues it (a resume, a
follow-up, a worker) gets the class back from it. A class defined where nothing can import it
(typed into ``manage.py shell``, a notebook, a script's ``__main__``) is remembered when it is
defined, so its runs go on in the process that defined it; another process (a worker) cannot
rebuild it, and the error says to declare it in a module of the project.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

#: every agent class defined in this process, by its path (the newest definition of a path wins)
_defined: dict[str, type] = {}


def remember(cls: type) -> None:
    _defined[f"{cls.__module__}.{cls.__qualname__}"] = cls


def agent_class(path: str) -> Any:
    """The agent class stored as ``path``: imported, or defined in this process. ``ImportError``
    (saying where to declare it) when neither finds it."""
    try:
        return import_string(path)
    except ImportError as exc:
        found = _defined.get(path)
        if found is not None:
            return found
        raise ImportError(
            f"{exc} (an agent class must be importable by its path in every process that continues its "
            "runs: declare it in a module of the project, e.g. yourapp/agents.py, not in a shell)"
        ) from exc
