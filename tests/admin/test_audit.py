"""The decision log as CSV and JSON: who, when, what, digest, source, note, rule; filtered like the
changelist; streamed (scripted agents for the real decisions)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from nexo_django.durable.recovery import reconcile
from nexo_django.models import ApprovalRule, Decision, ToolCall, Verdict
from tests.admin.support import DECISIONS, approver, client_for, csrf_post, pending_rows
from tests.durable_agents import Scribe
from tests.lifecycle_agents import Hurried

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

CSV = DECISIONS + "export/csv/"
JSON = DECISIONS + "export/json/"


def body(response: Any) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def decided(tmp_path: Path) -> dict[str, Any]:
    """One decision of each source: a person's approval and denial, an expiry, a rule's."""
    ann = approver()
    for name in ("a", "b", "c", "d"):
        (tmp_path / name).mkdir()
    approved = Scribe.run("one", cwd=tmp_path / "a").pending_calls().get()
    approved.approve(by=ann, note="=HYPERLINK(\"http://evil.example\")")
    denied = Scribe.run("two", cwd=tmp_path / "b").pending_calls().get()
    denied.deny(by=ann, note="not now")
    expiring = Hurried.run("three", cwd=tmp_path / "c").pending_calls().get()
    reconcile(now=expiring.expires_at + timedelta(seconds=1))
    rule = ApprovalRule.objects.create(tool="write", path="/notes.txt", verdict=Verdict.APPROVED, note="standing")
    Scribe.run("four", cwd=tmp_path / "d")
    return {"ann": ann, "approved": approved, "denied": denied, "expiring": expiring, "rule": rule}


def test_csv_has_every_decision_with_who_when_what(decided: dict[str, Any]) -> None:
    response = client_for(decided["ann"]).get(CSV)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert len(rows) == 4
    by_source = {r["source"]: r for r in rows}
    assert set(by_source) == {"api", "expiry", "rule"} and [r["source"] for r in rows].count("api") == 2
    person = next(r for r in rows if r["note"] == "not now")
    assert (person["verdict"], person["decided_by"], person["tool"]) == ("denied", "ann", "write")
    assert person["digest"] == decided["denied"].digest and json.loads(person["args"])["path"] == "notes.txt"
    assert by_source["expiry"]["decided_by"] == "" and by_source["expiry"]["verdict"] == "denied"
    assert by_source["rule"]["rule"] == str(decided["rule"].pk)
    assert all(r["decided_at"] for r in rows)


def test_csv_cells_never_run_as_spreadsheet_formulas(decided: dict[str, Any]) -> None:
    rows = list(csv.DictReader(io.StringIO(body(client_for(decided["ann"]).get(CSV)))))
    note = next(r["note"] for r in rows if "HYPERLINK" in r["note"])
    assert note.startswith("'=")


def test_json_export_matches_and_follows_the_changelist_filters(decided: dict[str, Any]) -> None:
    client = client_for(decided["ann"])
    everything = json.loads(body(client.get(JSON)))
    assert len(everything) == 4 and {"decided_at", "decided_by", "args", "digest", "source", "note", "rule"} <= set(everything[0])
    expired = json.loads(body(client.get(JSON + "?outcome=expired")))
    assert [d["source"] for d in expired] == ["expiry"]
    by_rule = json.loads(body(client.get(JSON + "?source=rule")))
    assert [d["rule"] for d in by_rule] == [decided["rule"].pk]
    searched = json.loads(body(client.get(JSON + f"?q={decided['denied'].run_id}")))
    assert [d["note"] for d in searched] == ["not now"]
    page = client.get(DECISIONS + "?outcome=expired").content.decode()
    assert 'href="/admin/nexo_django/decision/export/csv/?outcome=expired"' in page


def test_export_needs_a_staff_login_and_a_get() -> None:
    anonymous = Client().get(CSV)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    client = client_for(approver())
    assert csrf_post(client, CSV, {}).status_code == 405
    assert client.get(DECISIONS + "export/xml/").status_code == 400
    assert client.get(CSV + "?no_such_filter=1").status_code == 400


def test_the_export_reads_rows_as_it_streams() -> None:
    """Nothing is read until the body is consumed, and then through a server-side iterator in
    chunks (bench/audit_export.py measures the memory of 100 000 rows against a list)."""
    calls = pending_rows(30, agents=3)
    Decision.objects.bulk_create(
        Decision(tool_call=c, verdict="approved", digest=c.digest, source="api") for c in calls
    )
    response = client_for(approver()).get(CSV)
    with CaptureQueriesContext(connection) as queries:
        chunks = iter(response.streaming_content)
        header = next(chunks)
        assert not [q for q in queries if "nexo_django_decision" in q["sql"]]
        first = next(chunks)
        assert [q for q in queries if "nexo_django_decision" in q["sql"]]
    assert header.startswith(b"decided_at,verdict,source") and first.count(b"\n") == 1
    assert len(list(chunks)) == 29
    assert ToolCall.objects.count() == 30
