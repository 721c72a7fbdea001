"""The approval inbox changelist and its bulk actions, through Django's test client."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexo_django.models import AgentRun, CallStatus, Decision, RunStatus, ToolCall
from tests.admin.support import (
    INBOX,
    approver,
    client_for,
    csrf_post,
    make_user,
    pending_rows,
    viewer,
)
from tests.durable_agents import ParallelScribe, Scribe

# Decisions and searches behave the same on PostgreSQL: `make test` runs these there too.
pytestmark = [pytest.mark.durable]


def row_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(rf'name="{ACTION_CHECKBOX_NAME}" value="(\d+)"', html)]


def linked_calls(html: str) -> list[int]:
    found = re.findall(r'href="/admin/nexo_django/pendingapproval/(\d+)/change/', html)
    return [int(pk) for pk in dict.fromkeys(found)]  # two links per row, in row order


# --- listing -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_inbox_is_reachable_from_the_admin_index() -> None:
    html = client_for(approver()).get("/admin/").content.decode()
    assert f'href="{INBOX}"' in html and "Pending approvals" in html


@pytest.mark.django_db
def test_inbox_lists_pending_calls_oldest_first_with_their_context() -> None:
    user = make_user("starter")
    calls = pending_rows(6, agents=2, user=user)
    now = timezone.now()
    for age, call in enumerate(calls):
        ToolCall.objects.filter(pk=call.pk).update(created_at=now - timedelta(minutes=10 * age))
    ToolCall.objects.filter(pk=calls[0].pk).update(status=CallStatus.APPROVED)
    html = client_for(approver()).get(INBOX).content.decode()
    assert linked_calls(html) == [c.pk for c in reversed(calls[1:])]
    assert "Pending approvals (5 waiting)" in html
    assert "Agent1" in html and "starter" in html
    assert f'href="/admin/nexo_django/agentrun/{calls[1].run_id}/change/"' in html
    assert "&quot;path&quot;: &quot;f3.txt&quot;" in html  # the arguments preview
    assert "50\xa0minutes" in html  # the age of the oldest


@pytest.mark.django_db
def test_inbox_filters_by_agent_tool_capability_and_age() -> None:
    calls = pending_rows(8, agents=2)
    old = calls[:3]
    ToolCall.objects.filter(pk__in=[c.pk for c in old]).update(created_at=timezone.now() - timedelta(hours=3))
    client = client_for(approver())

    def listed(query: str) -> set[int]:
        return set(linked_calls(client.get(INBOX + "?" + query).content.decode()))

    assert listed("agent=tests.durable_agents.Agent1") == {c.pk for c in calls if c.run.agent.endswith("Agent1")}
    assert listed("name=write") == {c.pk for c in calls if c.name == "write"}
    assert listed("capability__exact=shell") == {c.pk for c in calls if c.capability == "shell"}
    assert listed("age=1h") == {c.pk for c in old}
    assert listed("age=new") == {c.pk for c in calls[3:]}


@pytest.mark.django_db
def test_inbox_search_by_run_id_and_tool() -> None:
    calls = pending_rows(6, agents=3)
    client = client_for(approver())
    run_id = calls[0].run_id
    in_run = {c.pk for c in calls if c.run_id == run_id}
    assert set(linked_calls(client.get(INBOX, {"q": str(run_id)}).content.decode())) == in_run
    assert set(linked_calls(client.get(INBOX, {"q": str(run_id)[:8]}).content.decode())) == in_run
    assert set(linked_calls(client.get(INBOX, {"q": "shell"}).content.decode())) == {c.pk for c in calls if c.name == "shell"}


def changelist_queries(client: Any) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(INBOX)
    assert response.status_code == 200
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.django_db
def test_inbox_query_count_does_not_grow_with_rows() -> None:
    client = client_for(approver())
    pending_rows(10)
    with_10 = changelist_queries(client)
    pending_rows(990)
    with_1000 = changelist_queries(client)
    assert len(with_10) == len(with_1000)
    # The filters' choices are read by index seeks, one query per choice (admin.filters), never
    # by a DISTINCT over every pending row (35 ms each at 100k on SQLite); the age filter's four
    # index probes; the runs that need attention named above the list.
    assert not [sql for sql in with_1000 if "DISTINCT" in sql]
    assert len(with_1000) <= 30


@pytest.mark.django_db
def test_filter_choices_past_the_seeks_are_read_at_once() -> None:
    from nexo_django.admin.filters import distinct_values

    pending_rows(8, agents=4)
    rows = ToolCall.objects.all()
    everything = sorted(set(rows.values_list("agent", flat=True)))
    assert len(everything) == 4
    assert distinct_values(rows, "agent") == everything
    with CaptureQueriesContext(connection) as ctx:
        assert distinct_values(rows, "agent", seeks=2) == everything
    assert len(ctx.captured_queries) == 3  # two seeks, then one DISTINCT for the rest
    assert distinct_values(rows.filter(agent="nobody"), "agent") == []


# --- permissions ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_staff_without_decide_permission_see_the_inbox_read_only() -> None:
    calls = pending_rows(3)
    client = client_for(viewer())
    html = client.get(INBOX).content.decode()
    assert set(linked_calls(html)) == {c.pk for c in calls}
    assert row_ids(html) == [] and "approve_selected" not in html
    response = csrf_post(client, INBOX, {"action": "approve_selected", "index": "0",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in calls]})
    assert response.status_code == 403
    assert ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).count() == 3


@pytest.mark.django_db
def test_plain_staff_see_the_inbox_read_only_from_the_index() -> None:
    calls = pending_rows(2)
    client = client_for(make_user("plain"))
    assert f'href="{INBOX}"' in client.get("/admin/").content.decode()
    html = client.get(INBOX).content.decode()
    assert set(linked_calls(html)) == {c.pk for c in calls} and row_ids(html) == []
    response = csrf_post(client, INBOX, {"action": "deny_selected", "confirm": "yes",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in calls]})
    assert response.status_code == 403
    assert not Decision.objects.exists()


@pytest.mark.django_db
def test_staff_need_a_view_permission_when_staff_can_view_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from nexo_django.admin import NexoModelAdmin

    monkeypatch.setattr(NexoModelAdmin, "staff_can_view", False)
    pending_rows(2)
    assert client_for(make_user("plain")).get(INBOX).status_code == 403
    assert client_for(viewer()).get(INBOX).status_code == 200


@pytest.mark.django_db
def test_users_who_are_not_staff_never_see_the_inbox() -> None:
    pending_rows(1)
    user = make_user("customer", "nexo_django.decide_toolcall", staff=False)
    response = client_for(user).get(INBOX)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_anonymous_users_are_sent_to_the_login_page() -> None:
    from django.test import Client

    response = Client().get(INBOX)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_pending_calls_and_decisions_cannot_be_added_edited_or_deleted() -> None:
    superuser = make_user("root")
    superuser.is_superuser = True
    superuser.save()
    [call] = pending_rows(1)
    client = client_for(superuser)
    assert client.get(INBOX + "add/").status_code == 403
    assert client.get(f"{INBOX}{call.pk}/delete/").status_code == 403
    assert csrf_post(client, f"{INBOX}{call.pk}/delete/", {"post": "yes"}).status_code == 403
    assert "delete_selected" not in client.get(INBOX).content.decode()
    assert client.get("/admin/nexo_django/decision/add/").status_code == 403
    assert client.get("/admin/nexo_django/agentrun/add/").status_code == 403
    assert csrf_post(client, f"/admin/nexo_django/agentrun/{call.run_id}/delete/", {"post": "yes"}).status_code == 403
    assert ToolCall.objects.filter(pk=call.pk, status=CallStatus.PENDING_APPROVAL).exists()


# --- bulk actions ----------------------------------------------------------------------------------------


def bulk(client: Any, action: str, calls: list[ToolCall], **extra: Any) -> Any:
    """Post the changelist's action form as a browser does: the checkboxes and the digests shown."""
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    data = {"action": action, "index": "0", ACTION_CHECKBOX_NAME: [c.pk for c in calls], **digests, **extra}
    return csrf_post(client, INBOX, data)


@pytest.fixture
def two_runs(tmp_path: Path) -> list[ToolCall]:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = ParallelScribe.run("two writes", cwd=tmp_path / "one")
    second = Scribe.run("one write", cwd=tmp_path / "two")
    return [*first.pending_calls(), *second.pending_calls()]


@pytest.mark.django_db(transaction=True)
def test_scripted_bulk_approve_decides_all_and_resumes_each_run(two_runs: list[ToolCall], tmp_path: Path) -> None:
    client = client_for(approver())
    response = bulk(client, "approve_selected", two_runs)
    assert response.status_code == 302
    assert Decision.objects.filter(verdict="approved").count() == 3
    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.DONE}
    assert (tmp_path / "one" / "a.txt").read_text() == "A" and (tmp_path / "two" / "notes.txt").read_text() == "hi"
    assert "Approved 3 call(s)" in client.get(response["Location"]).content.decode()


@pytest.mark.django_db(transaction=True)
def test_bulk_approve_is_all_or_nothing_when_one_was_decided_meanwhile(two_runs: list[ToolCall], tmp_path: Path) -> None:
    client = client_for(approver())
    html = client.get(INBOX).content.decode()  # the approver's page, before someone else acts
    two_runs[2].deny(note="someone else")
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    response = csrf_post(client, INBOX, {"action": "approve_selected", "index": "0",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in two_runs], **digests})
    assert response.status_code == 302
    assert Decision.objects.count() == 1  # only the other person's denial
    assert ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).count() == 2
    assert not (tmp_path / "one" / "a.txt").exists()
    message = client.get(response["Location"]).content.decode()
    assert "Nothing was decided" in message and two_runs[2].tool_call_id in message


@pytest.mark.django_db(transaction=True)
def test_bulk_approve_rolls_back_every_decision_on_a_stale_digest(two_runs: list[ToolCall], tmp_path: Path) -> None:
    client = client_for(approver())
    html = client.get(INBOX).content.decode()
    digests = dict(re.findall(r'name="(digest_\d+)" value="([0-9a-f]{64})"', html))
    digests[f"digest_{two_runs[-1].pk}"] = "0" * 64  # the last one is decided after the others
    response = csrf_post(client, INBOX, {"action": "approve_selected", "index": "0",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in two_runs], **digests})
    assert response.status_code == 302
    assert not Decision.objects.exists()
    assert ToolCall.objects.filter(status=CallStatus.PENDING_APPROVAL).count() == 3
    assert not (tmp_path / "one" / "a.txt").exists()
    assert "not the ones you saw" in client.get(response["Location"]).content.decode()


@pytest.mark.django_db(transaction=True)
def test_bulk_approve_refuses_calls_that_were_not_shown(two_runs: list[ToolCall]) -> None:
    client = client_for(approver())
    response = csrf_post(client, INBOX, {"action": "approve_selected", "index": "0", "select_across": "1",
                                         ACTION_CHECKBOX_NAME: [two_runs[0].pk]})
    assert response.status_code == 302
    assert not Decision.objects.exists()
    assert "not shown on this page" in client.get(response["Location"]).content.decode()


@pytest.mark.django_db(transaction=True)
def test_scripted_bulk_deny_asks_for_one_note_then_denies_all(two_runs: list[ToolCall], tmp_path: Path) -> None:
    client = client_for(approver())
    page = bulk(client, "deny_selected", two_runs)
    assert page.status_code == 200 and 'name="note"' in page.content.decode()
    assert not Decision.objects.exists()
    response = csrf_post(client, INBOX, {"action": "deny_selected", "confirm": "yes", "note": "not now",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in two_runs]})
    assert response.status_code == 302
    assert set(Decision.objects.values_list("verdict", "note")) == {("denied", "not now")}
    assert Decision.objects.count() == 3
    assert not any((tmp_path / d / f).exists() for d in ("one", "two") for f in ("a.txt", "b.txt", "notes.txt"))
    run = two_runs[-1].run
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.transcript()[-2]["content"] == {"error": "write denied by the approver: not now"}


@pytest.mark.django_db(transaction=True)
def test_bulk_deny_is_all_or_nothing(two_runs: list[ToolCall]) -> None:
    client = client_for(approver())
    two_runs[0].approve(note="someone else")
    response = csrf_post(client, INBOX, {"action": "deny_selected", "confirm": "yes", "note": "no",
                                         ACTION_CHECKBOX_NAME: [c.pk for c in two_runs]})
    assert response.status_code == 302
    assert list(Decision.objects.values_list("verdict", flat=True)) == ["approved"]
    assert two_runs[0].tool_call_id in client.get(response["Location"]).content.decode()


@pytest.mark.django_db(transaction=True)
def test_bulk_deny_by_staff_without_permission_is_refused(two_runs: list[ToolCall]) -> None:
    response = csrf_post(client_for(viewer()), INBOX, {"action": "deny_selected", "confirm": "yes", "note": "no",
                                                       ACTION_CHECKBOX_NAME: [c.pk for c in two_runs]})
    assert response.status_code == 403
    assert not Decision.objects.exists()
