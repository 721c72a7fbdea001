"""Hostile model text in the admin: markup stays text, bidi and zero-width characters are shown as
markers, and nothing of it reaches the page raw (scripted agent)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nexo_django.display import is_hidden, json_for_editor, reveal
from nexo_django.models import AgentRun, ToolCall
from tests.admin.support import (
    DECISIONS,
    HIDDEN,
    HOSTILE_CONTENT,
    INBOX,
    RLO,
    HostileScribe,
    approver,
    client_for,
    csrf_post,
    decision_url,
    page_digest,
    run_url,
)

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def hostile(tmp_path: Path) -> ToolCall:
    run = HostileScribe.run(f"prompt {RLO}with <b>markup</b>", cwd=tmp_path)
    [call] = run.pending_calls()
    return call


def assert_inert(html: str) -> None:
    assert "<script>alert" not in html
    assert 'href="javascript:' not in html and "<a href=\"javascript" not in html
    assert "<b>markup</b>" not in html
    for char in HIDDEN:
        assert char not in html, f"U+{ord(char):04X} reached the page raw"


def pages(client: Any, call: ToolCall) -> dict[str, str]:
    return {
        "inbox": client.get(INBOX).content.decode(),
        "decision": client.get(decision_url(call)).content.decode(),
        "run": client.get(run_url(call.run)).content.decode(),
    }


def test_hostile_text_is_inert_on_every_page(hostile: ToolCall) -> None:
    for name, html in pages(client_for(approver()), hostile).items():
        assert_inert(html)
        assert "⟦U+202E⟧" in html, name


def test_markup_is_shown_as_text(hostile: ToolCall) -> None:
    html = client_for(approver()).get(decision_url(hostile)).content.decode()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html
    assert "&lt;a href=&quot;javascript:alert(1)&quot;&gt;click me&lt;/a&gt;" in html


def test_each_hidden_character_is_named_on_the_decision_page(hostile: ToolCall) -> None:
    html = client_for(approver()).get(decision_url(hostile)).content.decode()
    for code in ("U+202E", "U+2066", "U+2069", "U+200B", "U+200D", "U+FEFF"):
        assert f"⟦{code}⟧" in html
    assert 'title="U+202E Right-To-Left Override"' in html
    assert 'id="hidden-warning"' in html


def test_the_editor_shows_hidden_characters_as_json_escapes(hostile: ToolCall) -> None:
    html = client_for(approver()).get(decision_url(hostile).replace("/change/", "/edit/")).content.decode()
    assert "report\\u202etxt.exe" in html


def test_scripted_hostile_run_finishes_after_approval_and_stays_inert(hostile: ToolCall, tmp_path: Path) -> None:
    client = client_for(approver())
    page = client.get(decision_url(hostile)).content.decode()
    csrf_post(client, decision_url(hostile), {"action": "approve", "digest": page_digest(page)})
    run = AgentRun.objects.get(pk=hostile.run_id)
    assert run.status == "done"
    assert (tmp_path / f"report{RLO}txt.exe").read_text() == HOSTILE_CONTENT
    for html in (client.get(run_url(run)).content.decode(), client.get(DECISIONS).content.decode()):
        assert_inert(html)


def test_hostile_note_from_an_approver_is_escaped_too(hostile: ToolCall) -> None:
    client = client_for(approver())
    page = client.get(decision_url(hostile)).content.decode()
    csrf_post(client, decision_url(hostile), {"action": "deny", "digest": page_digest(page),
                                              "note": f"<script>x()</script>{RLO}"})
    for html in (client.get(run_url(hostile.run)).content.decode(), client.get(DECISIONS).content.decode()):
        assert "<script>x()" not in html and RLO not in html
        assert '&lt;script&gt;x()&lt;/script&gt;<span class="nexo-hidden-char" title="U+202E' in html


@pytest.mark.parametrize(
    "char", ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
             "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2060", "\ufeff", "\u00ad", "\u061c",
             "\u2028", "\u2029", "\u00a0", "\u3164", "\ufe0f", "\U000e0041", "\x07", "\x1b", "\r"],
)
def test_reveal_marks_every_invisible_or_bidi_character(char: str) -> None:
    assert is_hidden(char)
    html = str(reveal(f"a{char}b"))
    assert char not in html and f"⟦U+{ord(char):04X}⟧" in html


def test_reveal_keeps_ordinary_text_and_line_breaks() -> None:
    assert str(reveal("naïve café — 東京\n\tok")) == "naïve café — 東京\n\tok"


def test_editor_json_round_trips_hidden_characters() -> None:
    value = {"path": f"a{RLO}b\U000e0041", "n": 1}
    text = json_for_editor(value)
    assert all(not is_hidden(c) for c in text if c != "\n")
    assert json.loads(text) == value


def test_hostile_tool_name_and_call_id_never_reach_a_page_raw() -> None:
    """An MCP server names its tools and a provider names its calls: neither is trusted."""
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    from nexo_django.models import RunStatus, args_digest
    from tests.admin.support import ZWSP

    run = AgentRun.objects.create(agent="tests.admin.support.HostileScribe", prompt="p", status=RunStatus.SUSPENDED)
    call = ToolCall.objects.create(
        run=run, tool_call_id=f"call{ZWSP}1", name=f"wr{RLO}ite", capability="mcp", args={},
        digest=args_digest({}), status="pending_approval",
    )
    client = client_for(approver())
    for html in pages(client, call).values():
        assert RLO not in html and ZWSP not in html
        assert "⟦U+202E⟧" in html
    call.deny(note="decided elsewhere")
    response = csrf_post(client, INBOX, {"action": "deny_selected", "confirm": "yes", ACTION_CHECKBOX_NAME: [call.pk]})
    html = client.get(response["Location"]).content.decode()
    assert "Nothing was decided" in html and "wr⟦U+202E⟧ite" in html and RLO not in html
