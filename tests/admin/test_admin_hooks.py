"""A project narrows the inbox with the get_<thing>() hooks, on its own admin site, without copying
the admin (scripted agents)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin import AdminSite
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import path

from nexo_django.admin import AgentRunAdmin, DecisionAdmin, PendingApprovalAdmin
from nexo_django.models import (
    AgentRun,
    CallStatus,
    Decision,
    PendingApproval,
    RunMessage,
    RunStatus,
    ToolCall,
)
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


def _docs_recipe() -> AdminSite:
    """docs/admin.md's narrowing recipe, as written there, run against a site of its own (the
    recipe's ``admin.site`` is this site) that starts with the default admins."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    match = re.search(r"^```python\n(# myproject/admin\.py\n.*?)^```", text, re.S | re.M)
    assert match, "docs/admin.md has no myproject/admin.py block"
    recipe_site = AdminSite(name="recipe")
    for model, model_admin in ((PendingApproval, PendingApprovalAdmin), (AgentRun, AgentRunAdmin), (Decision, DecisionAdmin)):
        recipe_site.register(model, model_admin)
    code = compile(match.group(1).replace("admin.site.", "recipe_site."), "docs/admin.md recipe", "exec")
    exec(code, {"recipe_site": recipe_site})
    return recipe_site


recipe = _docs_recipe()
urlpatterns = [path("team/", site.urls), path("recipe/", recipe.urls)]

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


# --- the recipe of docs/admin.md narrows everything it claims --------------------------------------

RECIPE = "/recipe/nexo_django/"


@pytest.fixture
def bobs(calls: dict[str, Any]) -> dict[str, Any]:
    """ann (a decider) and bob's waiting call, decided nowhere yet."""
    return {"ann": calls["user"], "call": calls["bob"], "run": calls["bob"].run}


@pytest.mark.durable
def test_docs_recipe_hides_another_approvers_call_everywhere(bobs: dict[str, Any]) -> None:
    client = client_for(bobs["ann"])
    call, run = bobs["call"], bobs["run"]
    for url in (f"{RECIPE}pendingapproval/", f"{RECIPE}agentrun/", f"{RECIPE}decision/"):
        response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert str(run.pk)[:8] not in html and "bob" not in html, url
    assert client.get(f"{RECIPE}agentrun/{run.pk}/change/").status_code == 404
    page = client.get(f"{RECIPE}pendingapproval/{call.pk}/change/").content.decode()
    assert "notes.txt" not in page  # the call's arguments are not shown


@pytest.mark.durable
def test_docs_recipe_lets_no_one_else_cancel_or_decide_the_run(bobs: dict[str, Any]) -> None:
    client = client_for(bobs["ann"])
    call, run = bobs["call"], bobs["run"]
    response = csrf_post(client, f"{RECIPE}agentrun/{run.pk}/change/", {"action": "cancel"})
    assert response.status_code == 404
    csrf_post(client, f"{RECIPE}agentrun/", {"action": "cancel_selected", "_selected_action": [str(run.pk)]})
    csrf_post(client, f"{RECIPE}pendingapproval/{call.pk}/change/", {"action": "deny", "digest": call.digest})
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert ToolCall.objects.get(pk=call.pk).status == CallStatus.PENDING_APPROVAL
    assert not Decision.objects.exists()


@pytest.mark.durable
def test_docs_recipe_still_shows_the_approver_their_own_run(calls: dict[str, Any]) -> None:
    client = client_for(calls["user"])
    run = calls["ann"].run
    html = client.get(f"{RECIPE}agentrun/{run.pk}/change/").content.decode()
    assert "ann&#x27;s run" in html and "notes.txt" in html
    assert f"{RECIPE}pendingapproval/{calls['ann'].pk}/change/" in client.get(f"{RECIPE}pendingapproval/").content.decode()


# --- a NUL in the query string -----------------------------------------------------------------------


@pytest.mark.durable
@pytest.mark.parametrize(
    "query",
    [
        "pendingapproval/?agent=%00", "pendingapproval/?name=a%00b", "pendingapproval/?q=%00",
        "pendingapproval/?capability=%00", "agentrun/?status=%00", "agentrun/?agent=x%00",
        "agentrun/?q=%00", "decision/?source=%00", "decision/?q=%00", "pendingapproval/?%00=1",
    ],
)
def test_a_nul_in_a_list_filter_is_a_clean_400(calls: dict[str, Any], query: str) -> None:
    response = client_for(calls["user"]).get(f"/team/nexo_django/{query}" if "decision" not in query else f"{RECIPE}{query}")
    assert response.status_code == 400
