"""The example project's pages and nexo_django's optional run views (scripted models).

The example app is installed and its URLconf mounted per test; the inline queue runs each job in
this process at commit, so the tests use transactional databases (commits really happen).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from example_project.notes.agents import NOTES, Scribe
from nexo_django.models import AgentRun, RunStatus
from nexo_django.testing import ScriptedModel, reply
from nexo_django.views import inbox_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _example(example: Path) -> Path:
    return example


def login(username: str, *perms: str) -> tuple[User, Client]:
    user = User.objects.create_user(username)
    for perm in perms:
        user.user_permissions.add(Permission.objects.get(codename=perm))
    client = Client()
    client.force_login(user)
    return user, client


def start(client: Client, agent: str = "scribe", prompt: str = "Write the release notes.") -> AgentRun:
    response = client.post("/", {"agent": agent, "prompt": prompt})
    assert response.status_code == 302
    run = AgentRun.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    return run


def test_the_form_enqueues_a_scripted_scribe_run_for_the_user_and_redirects_to_its_page(example: Path) -> None:
    user, client = login("ada")
    run = start(client, prompt="Please write notes.")
    assert run.agent == "example_project.notes.agents.Scribe"
    assert run.prompt == "Please write notes."
    assert run.created_by == user
    assert run.options["cwd"] == str(example)
    # The inline queue ran the job at commit: the draft passed, the publish waits for a person.
    assert run.status == RunStatus.SUSPENDED
    assert (example / "drafts" / "notes.md").read_text() == NOTES
    assert not (example / "published").exists()
    [call] = run.pending_calls()
    assert (call.name, call.args["path"]) == ("write", "published/notes.md")


def test_the_form_can_start_the_read_only_reviewer(example: Path) -> None:
    _, client = login("ada")
    run = start(client, agent="reviewer")
    assert run.agent == "example_project.notes.agents.Reviewer"
    assert run.status == RunStatus.DONE
    assert not run.pending_calls().exists()


def test_an_invalid_form_starts_nothing() -> None:
    _, client = login("ada")
    response = client.post("/", {"agent": "scribe", "prompt": ""})
    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    assert not AgentRun.objects.exists()


def test_the_form_needs_a_logged_in_user() -> None:
    response = Client().post("/", {"agent": "scribe", "prompt": "x"})
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert not AgentRun.objects.exists()


def test_the_run_page_shows_status_transcript_and_the_pending_call_linked_to_the_inbox() -> None:
    _, client = login("ada")
    run = start(client)
    [call] = run.pending_calls()
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-status="suspended"' in page
    assert "published/notes.md" in page
    assert "Write the release notes." in page  # the prompt, in the transcript
    assert "drafts/notes.md" in page  # the draft write and its result
    assert "content, as text:</div><pre># Release notes, version 1.0\n" in page  # multi-line, readable
    url = inbox_url(call)
    assert url is not None and url.startswith("/admin/nexo_django/")
    assert f'href="{url}"' in page


def test_a_waiting_run_page_polls_its_status_endpoint() -> None:
    _, client = login("ada")
    run = start(client)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    poll = json.loads(re.search(r'<script id="run-poll" type="application/json">(.*?)</script>', page).group(1))
    assert poll["url"] == f"/runs/{run.pk}/status/"
    assert poll["version"] == client.get(poll["url"]).json()["version"]


def test_a_queued_run_page_polls_faster_than_a_waiting_one() -> None:
    user, client = login("ada")
    run = AgentRun.objects.create(agent=Scribe.path(), prompt="p", created_by=user)  # queued, no job
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '"interval_ms": 1000' in page
    assert client.get(f"/runs/{run.pk}/status/").json()["active"] is True


def test_approving_finishes_the_run_and_its_page_stops_polling(example: Path) -> None:
    user, client = login("ada")
    run = start(client)
    run.pending_calls().get().approve(by=user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-status="done"' in page
    assert "(scripted model) Drafted drafts/notes.md and published published/notes.md." in page
    assert "run-poll" not in page
    assert (example / "published" / "notes.md").read_text() == NOTES


def test_the_status_endpoint_reports_the_waiting_call_then_the_finished_run() -> None:
    user, client = login("ada")
    run = start(client)
    waiting = client.get(f"/runs/{run.pk}/status/")
    assert waiting["Content-Type"] == "application/json"
    assert "no-cache" in waiting["Cache-Control"]
    body = waiting.json()
    assert (body["status"], body["active"], body["terminal"]) == ("suspended", False, False)
    assert [(p["name"], p["tool_call_id"]) for p in body["pending"]] == [("write", "call_2_0")]
    assert body["pending"][0]["inbox_url"] == inbox_url(run.pending_calls().get())
    run.pending_calls().get().approve(by=user)
    done = client.get(f"/runs/{run.pk}/status/").json()
    assert (done["status"], done["terminal"], done["pending"]) == ("done", True, [])
    assert done["result"].startswith("(scripted model)")
    assert done["version"] != body["version"]


def test_another_user_gets_404_for_the_run_page_and_its_status() -> None:
    _, ada = login("ada")
    run = start(ada)
    _, bob = login("bob")
    assert bob.get(f"/runs/{run.pk}/").status_code == 404
    response = bob.get(f"/runs/{run.pk}/status/")
    assert response.status_code == 404
    assert "suspended" not in response.content.decode() and "published" not in response.content.decode()


def test_an_anonymous_visitor_sees_no_status_and_is_sent_to_log_in_for_the_page() -> None:
    _, ada = login("ada")
    run = start(ada)
    anonymous = Client()
    assert anonymous.get(f"/runs/{run.pk}/status/").status_code == 404
    page = anonymous.get(f"/runs/{run.pk}/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/")


def test_a_user_who_may_decide_calls_sees_every_run() -> None:
    _, ada = login("ada")
    run = start(ada)
    _, approver = login("grace", "decide_toolcall")
    assert approver.get(f"/runs/{run.pk}/").status_code == 200
    assert approver.get(f"/runs/{run.pk}/status/").json()["status"] == "suspended"


def test_the_run_list_shows_only_the_users_own_runs() -> None:
    _, ada = login("ada")
    run = start(ada)
    _, bob = login("bob")
    assert str(run.pk) not in bob.get("/runs/").content.decode()
    assert f"/runs/{run.pk}/" in ada.get("/runs/").content.decode()


def test_model_text_is_escaped_and_hidden_characters_are_shown(example: Path) -> None:
    user, client = login("ada")
    example.mkdir()
    model = ScriptedModel([reply("<script>alert(1)</script> invoice\u202egpj.exe")])
    run = Scribe.run("Say something.", user=user, cwd=example, model=model)  # scripted, in process
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\u202e" not in page
    assert "U+202E" in page


def test_the_examples_frame_overrides_the_librarys_base_template(settings: Any) -> None:
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [Path("example_project/templates").resolve()]}]
    _, client = login("ada")
    run = start(client)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "nexo_django example" in page and 'action="/accounts/logout/"' in page  # the override's nav
    assert 'data-status="suspended"' in page  # the library's run page inside it
