"""Every ```python block in docs/ runs, so the documentation cannot drift from the code.

Blocks of one page share a namespace and run in order, in a temporary folder, with the test
settings and database (scripted models only: no model service is reachable).
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest
from django.contrib import admin

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if BLOCK.search(p.read_text()))


def test_docs_have_python_snippets() -> None:
    assert len(pages()) >= 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_python_snippets_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A page may register its own admin (docs/admin.md narrows the inbox): the site is given back
    # as it was, so tests that run after this one in the same process see the app's admin.
    registered = dict(admin.site._registry)
    try:
        _run_page(page, tmp_path, monkeypatch)
    finally:
        admin.site._registry.clear()
        admin.site._registry.update(registered)
    assert os.getcwd() == str(tmp_path)


def _run_page(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python block of ``page`` in order, in one namespace, from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    # A module of its own, importable by name while the page runs: a durable run rebuilds its
    # agent class from its dotted path (a follow-up, a job of the inline queue).
    module = types.ModuleType(f"docs_{page.stem.replace('-', '_')}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace: dict[str, object] = module.__dict__
    for number, match in enumerate(BLOCK.finditer(page.read_text()), start=1):
        code = compile(match.group(1), f"{page.name} block {number}", "exec")
        try:
            exec(code, namespace)
        except Exception as exc:  # name the page and block in the failure
            raise AssertionError(f"{page.name}, python block {number} failed: {exc!r}") from exc


@pytest.mark.django_db(transaction=True)
def test_the_follow_up_example_runs_in_manage_py_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/durable-runs.md's follow-up, pasted into ``manage.py shell`` (``shell -c``, in this
    process): its agent class is defined where nothing can import it by its path."""
    from django.core.management import call_command

    [block] = [m.group(1) for m in BLOCK.finditer((DOCS / "durable-runs.md").read_text()) if ".follow_up(" in m.group(1)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEXO_MODEL", raising=False)
    call_command("shell", command=block + "\nprint('follow-up:', second.result)")
    # The follow-up ran to the end and answered from the scripted second turn.
    assert "follow-up: About 2.1 million people." in capsys.readouterr().out


def test_the_admin_examples_declare_their_agents() -> None:
    """docs/admin.md's examples are pasted into a reader's project, which has no
    ``example_project``: they declare the agents they use."""
    for match in BLOCK.finditer((DOCS / "admin.md").read_text()):
        assert "example_project" not in match.group(1)
