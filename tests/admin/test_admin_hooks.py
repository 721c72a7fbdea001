"""A project narrows the inbox with the get_<thing>() hooks, on its own admin site, without copying
the admin (scripted agents)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin import AdminSite
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import path

from nexo_django.admin import AgentRunAdmin, PendingApprovalAdmin
from nexo_django.models import AgentRun, CallStatus, Decision, PendingApproval, RunMessage, ToolCall
from tests.admin.support import approver, client_for, csrf_post, make_user
from tests.durable_agents import Scribe


class OwnCallsInbox(PendingApprovalAdmin):
    """Only calls of runs the user started; system messages hidden from the transcript."""

    def get_inbox_queryset(self, request: HttpRequest) -> QuerySet[PendingApproval]:
        return super().get_inbox_queryset(request).filter(run__created_by=request.user)

    def get_transcript(self, request: HttpRequest, run: AgentRun) -> QuerySet[RunMessage]:
        return super().get_transcript(request, run).exclude(role="system")


site = AdminSite(name="team")
site.register(PendingApproval, OwnCallsInbox)
site.register(AgentRun, AgentRunAdmin)
urlpatterns = [path("team/", site.urls)]

INBOX = "/team/nexo_django/pendingapproval/"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(__name__)]


class Instructed(Scribe):
    instructions = "SYSTEM SECRET"


@pytest.fixture
def calls(tmp_path: Path) -> dict[str, ToolCall]:
    ann, bob = approver(), make_user("bob", "nexo_django.decide_toolcall")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    mine = Instructed.run("ann's run", cwd=tmp_path / "a", user=ann)
    theirs = Scribe.run("bob's run", cwd=tmp_path / "b", user=bob)
    return {"ann": mine.pending_calls().get(), "bob": theirs.pending_calls().get(), "user": ann}


def test_the_narrowed_inbox_lists_only_own_calls(calls: dict[str, Any]) -> None:
    html = client_for(calls["user"]).get(INBOX).content.decode()
    assert f"{INBOX}{calls['ann'].pk}/change/" in html
    assert f"{INBOX}{calls['bob'].pk}/change/" not in html
    assert "(1 waiting)" in html


def test_a_call_outside_the_narrowed_inbox_cannot_be_decided(calls: dict[str, Any], tmp_path: Path) -> None:
    client = client_for(calls["user"])
    other = calls["bob"]
    response = csrf_post(client, f"{INBOX}{other.pk}/change/", {"action": "approve", "digest": other.digest})
    assert response.status_code == 302
    other.refresh_from_db()
    assert other.status == CallStatus.PENDING_APPROVAL and not Decision.objects.exists()
    assert not (tmp_path / "b" / "notes.txt").exists()


def test_the_transcript_hook_and_this_sites_links_are_used(calls: dict[str, Any]) -> None:
    html = client_for(calls["user"]).get(f"{INBOX}{calls['ann'].pk}/change/").content.decode()
    assert "ann&#x27;s run" in html and "SYSTEM SECRET" not in html
    assert f'href="/team/nexo_django/agentrun/{calls["ann"].run_id}/change/"' in html
    assert 'href="/team/nexo_django/pendingapproval/"' in html  # breadcrumbs point at this site
