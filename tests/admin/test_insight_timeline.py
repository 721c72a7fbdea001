"""The picture of a run on its admin page: model turns, tool calls and waits for people (who
decided), and a workflow's steps, questions (who answered) and agents inside. Scripted agents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.admin.support import approver, client_for, run_url
from tests.lifecycle_agents import Hurried
from tests.workflows_for_tests import Release

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def spans(html: str, chart: str) -> list[tuple[str, str]]:
    svg = re.search(rf'<svg[^>]*id="{chart}".*?</svg>', html, re.S)
    assert svg, f"no {chart} on the page"
    return re.findall(r'data-lane="([^"]*)" data-label="([^"]*)"', svg.group(0))


def test_the_run_page_draws_its_turns_calls_and_who_decided(tmp_path: Path) -> None:
    ann = approver()
    run = Hurried.run("write a note", cwd=tmp_path)
    run.pending_calls().get().approve(by=ann)
    html = client_for(ann).get(run_url(run)).content.decode()
    drawn = spans(html, "run-timeline")
    assert drawn == [("model", "turn 1"), ("people", "call_0_0 approved"), ("tools", "write"), ("model", "turn 2")]
    assert "call_0_0 approved (" in html and "by ann</title>" in html


def test_a_workflow_page_draws_its_steps_questions_and_agents(counter: Path) -> None:
    ann = approver()
    run = Release.run({"version": "2.0"})
    run.pending_calls().get().approve(by=ann)  # the Drafter agent's write, inside the workflow
    run.answer("channel", "mail", by=ann)
    html = client_for(ann).get(run_url(run.agent_run)).content.decode()
    drawn = spans(html, "workflow-timeline")
    lanes = {lane for lane, _ in drawn}
    assert lanes == {"steps", "agents", "questions"}
    assert ("questions", "channel") in drawn and ("steps", "publish") in drawn
    assert "answered by ann</title>" in html
