"""Pages at the size a model can produce: every page of one call stays bounded, the decision buttons
never carry the arguments, and the rest is a permission-checked download (scripted agents)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from nexo_django import Agent, tool
from nexo_django.bounded import bounded_json, bounded_text, count_hidden
from nexo_django.models import AgentRun, CallStatus, RunStatus, ToolCall
from nexo_django.testing import ScriptedModel, reply, tool_call
from tests.admin.support import (
    approver,
    client_for,
    csrf_post,
    decision_url,
    make_user,
    run_url,
    viewer,
)
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

PAGE_LIMIT = 1_000_000  # SECURITY.md, approvals 7: any single call's page well under a megabyte


@tool(capability="shell", idempotent=False)
def stash(data: dict) -> dict:
    """Keeps a JSON value (any shape)."""
    return {"kept": len(json.dumps(data))}


class Stasher(Agent):
    """Scripted per test: one gated call of ``stash`` with whatever arguments the test gives."""

    tools = [stash]
    sandbox = "virtual"
    permissions = "approve"


def pending_write(tmp_path: Path, content: str) -> ToolCall:
    model = ScriptedModel([tool_call("write", path="big.txt", content=content), reply("ok")])
    run = Scribe.run("write it", cwd=tmp_path, model=model)
    return run.pending_calls().get()


def pending_stash(data: Any) -> ToolCall:
    run = Stasher.run("stash it", model=ScriptedModel([tool_call("stash", data=data), reply("ok")]))
    return run.pending_calls().get()


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {"level": level, "items": [value, "x" * 40]}
    return value


class FormFields(HTMLParser):
    """What a browser posts from one form: its inputs and textareas, with their values."""

    def __init__(self, form_id: str) -> None:
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.textarea: str | None = None
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "form" and attr.get("id") == self.form_id:
            self.inside = True
        elif self.inside and tag == "input" and attr.get("name") and attr.get("type") != "submit":
            self.fields[str(attr["name"])] = attr.get("value") or ""
        elif self.inside and tag == "textarea" and attr.get("name"):
            self.textarea = str(attr["name"])
            self.fields[self.textarea] = ""

    def handle_data(self, data: str) -> None:
        if self.textarea is not None:
            self.fields[self.textarea] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self.textarea = None
        elif tag == "form":
            self.inside = False


def browser_post(client: Any, call: ToolCall, action: str, note: str = "") -> Any:
    """Press a button of the decision form as a browser does: every field of the form is sent."""
    page = client.get(decision_url(call)).content.decode()
    parser = FormFields("decision-form")
    parser.feed(page)
    assert "digest" in parser.fields, "the decision page has no decision form"
    fields = {**parser.fields, "note": note, "action": action}
    fields.pop("csrfmiddlewaretoken", None)
    return csrf_post(client, decision_url(call), fields)


# --- the decision buttons never depend on the arguments' size --------------------------------


@pytest.mark.parametrize("action", ["approve", "deny", "deny_stop"])
def test_scripted_a_3_mb_argument_is_decided_by_every_button(tmp_path: Path, action: str) -> None:
    content = "line of a long file\n" * 150_000  # 3 MB, past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB)
    call = pending_write(tmp_path, content)
    response = browser_post(client_for(approver()), call, action, note="checked")
    assert response.status_code == 302
    call.refresh_from_db()
    assert call.status != CallStatus.PENDING_APPROVAL
    run = AgentRun.objects.get(pk=call.run_id)
    assert run.status == (RunStatus.CANCELLED if action == "deny_stop" else RunStatus.DONE)
    assert (tmp_path / "big.txt").exists() == (action == "approve")


def test_the_decision_form_posts_the_digest_the_file_version_and_the_note_only(tmp_path: Path) -> None:
    # The file version (a short token, whatever the arguments' size) binds Approve to the diff shown.
    call = pending_write(tmp_path, "x" * 10)
    parser = FormFields("decision-form")
    parser.feed(client_for(approver()).get(decision_url(call)).content.decode())
    assert set(parser.fields) == {"csrfmiddlewaretoken", "digest", "file_version", "note"}


# --- every page bounded -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("line of a long file\n" * 150_000, id="3MB"),
        pytest.param("\u200b" * 100_000, id="300kB-zero-width"),
        pytest.param("a\u200b" * 100_000, id="alternating-zero-width"),
    ],
)
def test_scripted_decision_and_run_pages_stay_under_a_megabyte(tmp_path: Path, content: str) -> None:
    call = pending_write(tmp_path, content)
    client = client_for(approver())
    for url in (decision_url(call), run_url(call.run), decision_url(call).replace("/change/", "/edit/")):
        response = client.get(url)
        assert response.status_code == 200, url
        assert len(response.content) < PAGE_LIMIT, (url, len(response.content))


def test_scripted_deeply_nested_arguments_stay_bounded() -> None:
    data = nested(200)  # 400 levels: under what the database stores (storable.MAX_DEPTH), 53 kB as in the issue
    assert len(json.dumps(data)) < 60_000
    call = pending_stash(data)
    response = client_for(approver()).get(decision_url(call))
    html = response.content.decode()
    assert response.status_code == 200 and len(response.content) < PAGE_LIMIT
    assert "nested too deep to show here" in html and 'id="args-clipped"' in html


def test_scripted_zero_width_characters_are_counted_and_collapsed(tmp_path: Path) -> None:
    call = pending_write(tmp_path, "\u200b" * 100_000)
    html = client_for(approver()).get(decision_url(call)).content.decode()
    assert "contain 100000 invisible" in html
    assert "⟦U+200B⟧</span><small>×8,000</small>" in html  # one marker for a run, with its count
    assert "\u200b" not in html


def test_what_is_left_out_is_said_outside_the_models_text() -> None:
    # The model can write "… more characters" itself; the page's own note is markup of its own.
    shown = bounded_json({"a": "… 5 more characters" + "y" * 20}, string_chars=10)
    assert shown.clipped
    assert '<span class="nexo-clipped">… 29 more characters</span>' in shown.html
    assert bounded_text("<b>" * 100, budget=40).html.startswith("&lt;b&gt;")


def test_counting_hidden_characters_of_a_huge_value_is_bounded() -> None:
    assert count_hidden({"a": "x" * 5_000_000}) == (0, True)
    assert count_hidden({"a": "\u202e" * 3, "b": ["\u200b"]}) == (4, True)
    found, exact = count_hidden({"a": "\u200b" * 3_000_000})
    assert 2_000_000 <= found < 3_000_000 and not exact


def test_scripted_the_editor_refuses_arguments_too_long_to_edit(tmp_path: Path) -> None:
    call = pending_write(tmp_path, "x" * 300_000)
    html = client_for(approver()).get(decision_url(call).replace("/change/", "/edit/")).content.decode()
    assert 'id="too-long-to-edit"' in html and 'name="edited_args"' not in html


# --- the rest on demand, permission-checked like the page ------------------------------------


def arguments_url(call: ToolCall) -> str:
    return decision_url(call).replace("/change/", "/arguments/")


def test_scripted_the_full_arguments_are_a_download_of_exactly_what_is_stored(tmp_path: Path) -> None:
    content = "\u202e\u200b" + "line\n" * 200_000
    call = pending_write(tmp_path, content)
    client = client_for(approver())
    page = client.get(decision_url(call)).content.decode()
    assert f'href="{arguments_url(call)}"' in page
    response = client.get(arguments_url(call))
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="call-{call.pk}-arguments.json"'
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert json.loads(response.content) == {"path": "big.txt", "content": content}
    run_download = client.get(f"{run_url(call.run).replace('/change/', '')}/calls/{call.pk}/arguments/")
    assert run_download.status_code == 200 and json.loads(run_download.content)["content"] == content


def test_scripted_the_download_is_refused_to_who_cannot_see_the_page(tmp_path: Path, settings: Any) -> None:
    call = pending_write(tmp_path, "secret content")
    anonymous = client_for(make_user("outsider", staff=False))
    response = anonymous.get(arguments_url(call))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert b"secret content" not in response.content
    # A staff user who may see the page may download, as the page shows the same arguments.
    assert client_for(viewer()).get(arguments_url(call)).status_code == 200
    # The download decides nothing and takes no POST.
    assert csrf_post(client_for(approver()), arguments_url(call), {"action": "approve"}).status_code == 405
    call.refresh_from_db()
    assert call.status == CallStatus.PENDING_APPROVAL


def test_scripted_a_decided_call_is_no_longer_downloadable_from_the_inbox(tmp_path: Path) -> None:
    call = pending_write(tmp_path, "x")
    client = client_for(approver())
    browser_post(client, call, "deny")
    assert client.get(arguments_url(call)).status_code == 404


def test_scripted_arguments_past_the_load_limit_are_cut_by_the_database(tmp_path: Path) -> None:
    from nexo_django.models import BIG_JSON, HEAD_CHARS, ToolCall

    content = "\u202e" + "a line of the file\n" * (BIG_JSON // 19 + 1_000)  # just past the limit
    call = pending_write(tmp_path, content)
    # The database stored the size and the head beside the value when it wrote the row.
    size, head = ToolCall.objects.values_list("args_size", "args_head").get(pk=call.pk)
    assert size > BIG_JSON and head is not None and len(head) == HEAD_CHARS
    assert ToolCall.objects.values_list("result_head", flat=True).get(pk=call.pk) is None
    client = client_for(approver())
    html = client.get(decision_url(call)).content.decode()
    assert 'id="args-clipped"' in html and "bytes of JSON, too many to load into this page" in html
    assert "too large to compare on this page" in html  # the write preview says so, never "unchanged"
    assert "already has exactly this content" not in html
    assert "\u202e" not in html, html[html.index("\u202e") - 300 : html.index("\u202e") + 50]
    assert 'id="hidden-warning"' in html
    assert len(html) < 200_000
    # "Always allow" still suggests the call's path, read from the head, not from the value.
    assert 'name="rule_path" id="id_rule_path" value="/big.txt"' in html
    run_page = client.get(run_url(call.run)).content.decode()
    assert "\u202e" not in run_page and len(run_page) < 200_000
    # The decision itself does not depend on what the page loaded.
    assert browser_post(client, call, "approve").status_code == 302
    assert (tmp_path / "big.txt").read_text() == content


@pytest.mark.parametrize(("head", "found"), [
    ('{"path": "a/b.txt", "content": "the cut falls in this val', {"path": "a/b.txt"}),
    ('{ "content" : "x",\n "path": "p", "command": ["ls"]}', {"path": "p", "command": ["ls"]}),
    ('{"content": "x", "path": "a/b', {}),  # the path itself is cut: never guessed
    ('{"__nexo__": "dict", "v": [["path", "x"]]}', {}),  # an escaped object: nothing read plainly
    ('["path", "x"]', {}),
    ("", {}),
])
def test_head_keys_reads_only_members_whole_inside_the_head(head: str, found: dict[str, Any]) -> None:
    from nexo_django.admin.loading import head_keys

    assert head_keys(head, ("path", "command")) == found
