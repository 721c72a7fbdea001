"""docs/admin.md lists the decision sources as the code records them, one name each (issue 32,
item 8: the JSON endpoint records ``json``; the docs used to say ``api`` only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nexo_django.models import DECISION_SOURCES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "admin.md"


def _documented() -> dict[str, str]:
    section = DOCS.read_text().split("### Decision sources", 1)[1].split("\n### ", 1)[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([a-z-]+)` +\| (.+?) +\|$", section, re.M)}


def test_the_docs_list_every_source_the_code_records_with_its_meaning() -> None:
    documented = _documented()
    assert set(documented) == set(DECISION_SOURCES)
    for name, where in DECISION_SOURCES.items():
        assert documented[name].replace("`", "") == where


@pytest.mark.parametrize(("module", "source"), [
    ("nexo_django/views.py", 'source="json"'),
    ("nexo_django/admin/views.py", 'source="admin"'),
    ("nexo_django/admin/views.py", 'source="admin-bulk"'),
    ("nexo_django/durable/runs.py", 'source="resume"'),
    ("nexo_django/durable/runs.py", 'source="rule"'),
    ("nexo_django/durable/expiry.py", 'source="expiry"'),
    ("nexo_django/models.py", 'source: str = "api"'),
])
def test_each_entry_point_records_a_documented_source(module: str, source: str) -> None:
    text = (DOCS.parents[1] / module).read_text()
    assert source in text
    assert source.split('"')[1] in DECISION_SOURCES
