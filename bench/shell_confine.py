"""Benchmark: the time confinement adds to one ``shell`` call.

``LocalSandbox.shell("true")`` in one workspace, N times each, interleaved: unconfined (the peer:
``confine=False``, today's limits-only shell), confined (bubblewrap, no network), and confined
with one allowed host (the egress proxy and the in-sandbox forwarder start with every call).
Prints the median and p95 of each, and the added time of each confined form over the peer.
The workspace holds a small tree (so the walk for protected names has something to do).

    python -m bench.shell_confine [--calls 50] [--files 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import figure, median, ms, note, p95


def make_workspace(files: int) -> Path:
    root = Path(tempfile.mkdtemp(prefix="nexo-bench-shell-"))
    (root / ".git" / "hooks").mkdir(parents=True)
    for index in range(files):
        folder = root / f"pkg{index % 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{index}.py").write_text("x = 1\n")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--files", type=int, default=200)
    options = parser.parse_args()

    from nexo_django.core.sandboxes.confine import ShellPolicy, bwrap_problem
    from nexo_django.core.sandboxes.local import LocalSandbox
    from nexo_django.core.tools.egress import EgressProxy

    problem = bwrap_problem(ShellPolicy())
    if problem:
        raise SystemExit(problem)
    root = make_workspace(options.files)
    try:
        kinds = {
            "unconfined": LocalSandbox(root, confine=False),
            "confined": LocalSandbox(root),
            "confined_network": LocalSandbox(root, shell=ShellPolicy(network=("pypi.org",), egress=EgressProxy)),
        }
        times: dict[str, list[float]] = {name: [] for name in kinds}
        for sandbox in kinds.values():  # one warm-up call each (imports, the page cache)
            assert sandbox.shell("true", timeout=30, max_output=1024).get("exit_code") == 0
        for _ in range(options.calls):
            for name, sandbox in kinds.items():  # interleaved: a slow moment hits every kind
                start = time.perf_counter_ns()
                result = sandbox.shell("true", timeout=30, max_output=1024)
                times[name].append(time.perf_counter_ns() - start)
                assert result.get("exit_code") == 0, result
        peer = median(times["unconfined"])
        note(f"{options.calls} calls of `true` each, workspace of {options.files} files; the peer is confine=False")
        for name, values in times.items():
            figure(
                f"shell_{name}", calls=options.calls, median_ms=ms(median(values)), p95_ms=ms(p95(values)),
                added_ms=ms(median(values) - peer),
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
