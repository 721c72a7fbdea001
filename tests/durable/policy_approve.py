"""A process that approves one call as one person, at a signal (test_policy_quorum.py starts two).

``python -m tests.durable.policy_approve <call pk> <username> <go file>``: waits until the go file
exists, approves, prints what it got ("approval", "decision", "already decided")."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from nexo_django.core.errors import AlreadyDecided
    from nexo_django.models import Decision, ToolCall

    pk, username, go = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    user = get_user_model().objects.get(username=username)
    call = ToolCall.objects.select_related("run").get(pk=pk)
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        got = call.approve(by=user)
    except AlreadyDecided:
        print("already decided")
        return
    print("decision" if isinstance(got, Decision) else "approval")


if __name__ == "__main__":
    main()
