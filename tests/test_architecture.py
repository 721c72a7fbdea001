"""The folders are the layers: imports point down, the core is plain Python, no circles, and
every public import path a user writes still works (as the name's home or a re-export)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: what users write (docs, README, issue 20): module -> names it must give
PUBLIC_PATHS = {
    "nexo_django": ("Agent", "Permissions", "Denied", "ApprovalRequired", "SecurityError",
                    "ConfigurationError", "NexoError", "Reply", "Tool", "ToolContext", "tool"),
    "nexo_django.models": ("AgentRun", "ToolCall", "Decision", "RunEvent", "RunMessage",
                           "PendingApproval", "args_digest"),
    "nexo_django.mcp": ("MCPServer",),
    "nexo_django.testing": ("ScriptedModel", "reply", "tool_call"),
    "nexo_django.sandboxes": ("VirtualSandbox", "LocalSandbox", "Sandbox", "DEFAULT_PROTECTED"),
    "nexo_django.sandboxes.local": ("LocalSandbox",),
    "nexo_django.recovery": ("reconcile", "Report"),
    "nexo_django.llm": ("Completion", "Model", "resolve_model"),
    "nexo_django.llm.base": ("Completion", "Message", "Model"),
    "nexo_django.llm.openai": ("OpenAIModel",),
    "nexo_django.llm.anthropic": ("AnthropicModel",),
    "nexo_django.llm.http": ("ProviderError",),
    "nexo_django.tools": ("Tool", "ToolContext", "Limits", "tool", "READ", "WRITE"),
    "nexo_django.errors": ("NexoError", "ConfigurationError", "MaxTurnsExceeded", "AlreadyDecided",
                           "StaleDecision", "TransitionError", "InvalidEditedArguments"),
    "nexo_django.signals": ("run_status_changed", "approval_requested", "approval_decided"),
}


@pytest.mark.parametrize(("module", "names"), sorted(PUBLIC_PATHS.items()))
def test_public_import_paths_keep_working(module: str, names: tuple[str, ...]) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert missing == []


def test_a_re_export_is_the_same_object_as_its_home() -> None:
    from nexo_django.core.sandboxes.local import LocalSandbox
    from nexo_django.core.tools import Tool
    from nexo_django.durable.recovery import reconcile
    from nexo_django.sandboxes.local import LocalSandbox as Reexported

    assert Reexported is LocalSandbox
    assert importlib.import_module("nexo_django.tools").Tool is Tool
    assert importlib.import_module("nexo_django.recovery").reconcile is reconcile


def _module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph.modules:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    # TYPE_CHECKING imports count: a circle for the type checker is one for the reader too.
    graph = grimp.build_graph("nexo_django", include_external_packages=False)
    # A package imports its own submodules to re-export them; that is not a circle.
    for module in list(graph.modules):
        for child in graph.find_children(module):
            if graph.direct_import_exists(importer=module, imported=child):
                graph.remove_import(importer=module, imported=child)
    assert _module_cycles(graph) == []


def test_the_cycle_finder_sees_a_circle() -> None:
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _module_cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_import_contracts_hold() -> None:
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 kept, 0 broken" in done.stdout
