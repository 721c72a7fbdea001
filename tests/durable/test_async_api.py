"""``await Scribe.arun_later(...)`` and ``await run.apending_calls()`` from async views served by a
real ASGI server (uvicorn on a loopback port, in this process), issue 24, item 9. Before them,
``run_later`` in an async view raised ``SynchronousOnlyOperation``. Scripted model."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from nexo_django.models import AgentRun, RunStatus
from tests.durable_agents import Scribe

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.durable]

WORKSPACE: dict[str, str] = {}


@csrf_exempt  # the project's own start view; CSRF is not what this test is about
async def start_view(request: HttpRequest) -> JsonResponse:
    run = await Scribe.arun_later("write hi", cwd=WORKSPACE["cwd"])
    return JsonResponse({"id": str(run.pk), "status": run.status})


async def pending_view(request: HttpRequest, pk: str) -> JsonResponse:
    run = await AgentRun.objects.aget(pk=pk)
    calls = await run.apending_calls()
    return JsonResponse({"status": run.status, "pending": [c.name for c in calls]})


@csrf_exempt
async def decide_view(request: HttpRequest, pk: str) -> JsonResponse:
    """Approve, deny or cancel from an async view: the model's async methods."""
    run = await AgentRun.objects.aget(pk=pk)
    action = json.loads(request.body)["action"]
    if action == "cancel":
        return JsonResponse({"cancelled": await run.acancel(reason="from an async view")})
    [call] = await run.apending_calls()
    decision = await (call.aapprove(note="async") if action == "approve" else call.adeny(stop=True))
    return JsonResponse({"verdict": decision.verdict})


urlpatterns = [
    path("start/", start_view),
    path("runs/<uuid:pk>/pending/", pending_view),
    path("runs/<uuid:pk>/decide/", decide_view),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def asgi_server(settings: Any, tmp_path: Path) -> Iterator[str]:
    import uvicorn
    from django.core.asgi import get_asgi_application

    settings.ROOT_URLCONF = __name__
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    WORKSPACE["cwd"] = str(tmp_path)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(get_asgi_application(), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_async_views_start_a_run_and_read_its_pending_calls_scripted(asgi_server: str) -> None:
    with httpx.Client(base_url=asgi_server, timeout=10, trust_env=False) as client:
        started = client.post("/start/")
        assert started.status_code == 200, started.text
        run_id = started.json()["id"]
        # The test queue is inline: the run went on at commit, up to its approval.
        pending = client.get(f"/runs/{run_id}/pending/")
        assert pending.status_code == 200, pending.text
    assert json.loads(pending.text) == {"status": RunStatus.SUSPENDED, "pending": ["write"]}
    assert AgentRun.objects.get(pk=run_id).status == RunStatus.SUSPENDED


def test_async_views_approve_deny_and_cancel_scripted(asgi_server: str, tmp_path: Path) -> None:
    with httpx.Client(base_url=asgi_server, timeout=10, trust_env=False) as client:
        ids = [client.post("/start/").json()["id"] for _ in range(3)]
        approved = client.post(f"/runs/{ids[0]}/decide/", content=json.dumps({"action": "approve"}))
        denied = client.post(f"/runs/{ids[1]}/decide/", content=json.dumps({"action": "deny"}))
        cancelled = client.post(f"/runs/{ids[2]}/decide/", content=json.dumps({"action": "cancel"}))
    assert approved.json() == {"verdict": "approved"} and denied.json() == {"verdict": "denied"}
    assert cancelled.json() == {"cancelled": True}
    # The inline queue resumed the approved run inside the request: it wrote, and finished.
    assert [AgentRun.objects.get(pk=i).status for i in ids] == [RunStatus.DONE, RunStatus.CANCELLED, RunStatus.CANCELLED]
    assert (tmp_path / "notes.txt").read_text() == "hi"
