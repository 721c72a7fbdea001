"""``run_later(..., at=when)``: the run is stored now, its job waits in rq's scheduler; bad times
are refused before anything is stored (scripted models)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from nexo_django.core.errors import ConfigurationError
from nexo_django.models import AgentRun
from tests.schedule_agents import Nightly, Tally

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]


def test_an_inline_queue_refuses_a_future_time_and_stores_nothing() -> None:
    with pytest.raises(ConfigurationError, match=r"is inline .* rqworker --with-scheduler"):
        Nightly.run_later("x", at=timezone.now() + timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="is inline"):
        Tally.run_later({"a": 1}, at=timezone.now() + timedelta(hours=1))
    assert not AgentRun.objects.exists()


def test_a_naive_datetime_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="has no timezone; give an aware one"):
        Nightly.run_later("x", at=datetime(2030, 1, 1, 7, 0))
    with pytest.raises(TypeError, match="give a datetime"):
        Nightly.run_later("x", at="tomorrow")  # type: ignore[arg-type]
    assert not AgentRun.objects.exists()


def test_a_time_already_past_runs_now() -> None:
    run = Nightly.run_later("x", at=timezone.now() - timedelta(minutes=1))
    assert run.status == "done", run.error
    assert run.not_before is None
    flow = Tally.run_later({"n": 2}, at=timezone.now() - timedelta(seconds=1))
    assert flow.status == "done"
