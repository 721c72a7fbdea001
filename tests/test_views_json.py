"""The JSON endpoints for single-page and mobile front ends (issue 24, item 9): a run's status and
events, and a decision on a call by a user who may decide, with session auth and CSRF. Scripted
agent, inline queue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from nexo_django.models import Decision, RunStatus
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def _user(django_user_model: Any, name: str, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(name, password="x")
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="nexo_django", codename=codename))
    return user


def _client(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _csrf(client: Client, run: Any) -> str:
    client.get(f"/runs/{run.pk}/status/")  # the status endpoint sets the CSRF cookie
    return client.cookies["csrftoken"].value


def test_status_events_and_a_decision_over_json_scripted(example: Path, tmp_path: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann", "decide_toolcall")
    run = Scribe.run("write hi", cwd=tmp_path, user=ann)
    client = _client(ann)
    status = client.get(f"/runs/{run.pk}/status/").json()
    [pending] = status["pending"]
    events = client.get(f"/runs/{run.pk}/events/").json()
    assert [e["type"] for e in events["events"]][:1] == ["created"] and events["more"] is False
    last = events["events"][-1]["id"]
    url = f"/runs/{run.pk}/calls/{pending['id']}/decide/"
    body = json.dumps({"verdict": "approve", "digest": pending["digest"]})
    assert client.post(url, body, content_type="application/json").status_code == 403  # no CSRF token
    token = _csrf(client, run)
    decided = client.post(url, body, content_type="application/json", headers={"X-CSRFToken": token})
    assert decided.status_code == 200, decided.content
    assert decided.json()["verdict"] == "approved" and decided.json()["run_status"] == RunStatus.DONE
    assert (tmp_path / "notes.txt").read_text() == "hi"
    newer = client.get(f"/runs/{run.pk}/events/?after={last}").json()["events"]
    assert newer and all(e["id"] > last for e in newer)
    again = client.post(url, body, content_type="application/json", headers={"X-CSRFToken": token})
    assert again.status_code == 409 and "already decided" in again.json()["error"]
    assert Decision.objects.count() == 1


def test_deciding_needs_the_permission_and_the_digest_shown(example: Path, tmp_path: Path, django_user_model: Any) -> None:
    ann = _user(django_user_model, "ann")
    run = Scribe.run("write hi", cwd=tmp_path, user=ann)
    call = run.pending_calls().get()
    url = f"/runs/{run.pk}/calls/{call.pk}/decide/"
    client = _client(ann)
    token = _csrf(client, run)
    body = json.dumps({"verdict": "approve", "digest": call.digest})
    refused = client.post(url, body, content_type="application/json", headers={"X-CSRFToken": token})
    assert refused.status_code == 403 and "decide_toolcall" in refused.json()["error"]
    bob = _user(django_user_model, "bob", "decide_toolcall")
    bob_client = _client(bob)
    bob_token = _csrf(bob_client, run)
    stale = bob_client.post(url, json.dumps({"verdict": "approve", "digest": "0" * 64}),
                            content_type="application/json", headers={"X-CSRFToken": bob_token})
    assert stale.status_code == 409 and "not the ones you saw" in stale.json()["error"]
    bad = bob_client.post(url, "{not json", content_type="application/json", headers={"X-CSRFToken": bob_token})
    assert bad.status_code == 400
    assert not Decision.objects.exists() and not (tmp_path / "notes.txt").exists()
    eve = _user(django_user_model, "eve")
    assert _client(eve).get(f"/runs/{run.pk}/events/").status_code == 404  # not eve's run


def _decide(client: Client, run: Any, call_id: int, token: str, **body: Any) -> Any:
    return client.post(f"/runs/{run.pk}/calls/{call_id}/decide/", json.dumps(body),
                       content_type="application/json", headers={"X-CSRFToken": token})


def _waiting_run(django_user_model: Any, tmp_path: Path) -> tuple[Any, Client, str, dict[str, Any]]:
    """A scripted Scribe run of a user who may decide, waiting on its write: the run, the user's
    client, its CSRF token and the pending call as the status endpoint serves it."""
    ann = _user(django_user_model, "ann", "decide_toolcall")
    run = Scribe.run("write hi", cwd=tmp_path, user=ann)
    client = _client(ann)
    token = _csrf(client, run)
    [pending] = client.get(f"/runs/{run.pk}/status/").json()["pending"]
    return run, client, token, pending


def test_deny_and_stop_over_json_stops_the_run_scripted(example: Path, tmp_path: Path, django_user_model: Any) -> None:
    run, client, token, pending = _waiting_run(django_user_model, tmp_path)
    assert pending["args"] == {"path": "notes.txt", "content": "hi"} and pending["file_version"] == ""
    wrong = _decide(client, run, pending["id"], token, verdict="approve", digest=pending["digest"], stop=True)
    assert wrong.status_code == 400 and "goes with a denial" in wrong.json()["error"]
    stopped = _decide(client, run, pending["id"], token, verdict="deny", digest=pending["digest"], stop=True, note="no")
    assert stopped.status_code == 200, stopped.content
    assert stopped.json()["stop"] is True and stopped.json()["run_status"] == RunStatus.CANCELLED
    decision = Decision.objects.get()
    assert decision.stop is True and decision.source == "json"
    assert not (tmp_path / "notes.txt").exists()


def test_approve_with_edited_arguments_over_json_scripted(example: Path, tmp_path: Path, django_user_model: Any) -> None:
    run, client, token, pending = _waiting_run(django_user_model, tmp_path)
    escape = _decide(client, run, pending["id"], token, verdict="approve", digest=pending["digest"],
                     args={"path": "../outside.txt", "content": "x"})
    assert escape.status_code == 400 and "edited arguments refused" in escape.json()["error"]
    assert not (tmp_path.parent / "outside.txt").exists() and not Decision.objects.exists()
    denied_edit = _decide(client, run, pending["id"], token, verdict="deny", digest=pending["digest"], args={})
    assert denied_edit.status_code == 400 and "go with an approval" in denied_edit.json()["error"]
    edited = _decide(client, run, pending["id"], token, verdict="approve", digest=pending["digest"],
                     args={"path": "notes.txt", "content": "edited"})
    assert edited.status_code == 200, edited.content
    assert (tmp_path / "notes.txt").read_text() == "edited"
    assert Decision.objects.get().args == {"path": "notes.txt", "content": "edited"}


def test_an_overwrite_approved_over_json_is_bound_to_the_version_served_scripted(
    example: Path, tmp_path: Path, django_user_model: Any
) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("old notes\n")
    ann = _user(django_user_model, "ann", "decide_toolcall")
    client = _client(ann)
    first = Scribe.run("write hi", cwd=tmp_path, user=ann)
    token = _csrf(client, first)
    [pending] = client.get(f"/runs/{first.pk}/status/").json()["pending"]
    assert pending["file_version"]  # the version of the file it would replace
    target.write_text("someone else's edit\n")  # changed after the front end showed it
    response = _decide(client, first, pending["id"], token, verdict="approve", digest=pending["digest"],
                       file_version=pending["file_version"])
    assert response.status_code == 200
    assert target.read_text() == "someone else's edit\n"
    second = Scribe.run("write hi", cwd=tmp_path, user=ann)
    [pending] = client.get(f"/runs/{second.pk}/status/").json()["pending"]
    response = _decide(client, second, pending["id"], token, verdict="approve", digest=pending["digest"],
                       file_version=pending["file_version"])
    assert response.status_code == 200 and response.json()["run_status"] == RunStatus.DONE
    assert target.read_text() == "hi"
