"""Runs that need a person are in the approval inbox with what to decide, and a recovered run
keeps no old error beside Done (issue 24, item 5). Scripted agents; the crashed worker's state is
left as the reconciler finds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexo_django.models import AgentRun, RunStatus
from tests.admin.support import INBOX, approver, client_for, csrf_post, run_url, viewer
from tests.admin.test_admin_runs import crashed_while_executing

pytestmark = [pytest.mark.durable, pytest.mark.django_db(transaction=True)]


def test_the_inbox_lists_a_run_that_needs_attention_with_what_to_decide_scripted(counter: Path) -> None:
    call = crashed_while_executing(approver())
    page = client_for(viewer()).get(INBOX).content.decode()
    assert "needs a person" in page
    assert f"decide whether bump ({call.tool_call_id}) runs again" in page
    assert f'href="{run_url(call.run)}"' in page


def test_the_inbox_says_nothing_when_no_run_needs_attention() -> None:
    page = client_for(viewer()).get(INBOX).content.decode()
    assert "needs a person" not in page


def test_a_settled_run_keeps_no_old_error_beside_done_scripted(counter: Path) -> None:
    ann = approver()
    call = crashed_while_executing(ann)
    assert "outcome is unknown" in AgentRun.objects.get(pk=call.run_id).error
    response = csrf_post(client_for(ann), run_url(call.run), {"action": "do_not_rerun", "call": call.pk})
    assert response.status_code == 302
    run = AgentRun.objects.get(pk=call.run_id)
    assert run.status == RunStatus.DONE
    assert run.error == ""
