"""Benchmark: the time confinement adds to one ``shell`` call.

``LocalSandbox.shell("true")`` in one workspace, N times each, interleaved: unconfined (the peer:
``confine=False``, today's limits-only shell), confined (bubblewrap, no network), and confined
with one allowed host (the egress proxy and the in-sandbox forwarder start with every call).
Prints the median and p95 of each, and the added time of each confined form over the peer.
The workspace holds a small tree (so the walk for protected names has something to do). With
``--walk-entries N`` it also times the two walks of the workspace each confined call makes
(before: protected names, quota, ownership; after: set-id bits, quota) over a tree of N files,
the part of a call's cost that grows with the tree.

To compare two versions (issue 31: before and after hardening), run it alternately from each
checkout; the machine's load is printed with each run.

    python -m bench.shell_confine [--calls 50] [--files 200] [--walk-entries 20000]
"""

from __future__ import annotations

import argparse
import os
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
    parser.add_argument("--walk-entries", type=int, default=0)
    options = parser.parse_args()

    from nexo_django.core.sandboxes.confine import ShellPolicy, bwrap_problem
    from nexo_django.core.sandboxes.local import LocalSandbox
    from nexo_django.core.tools.egress import EgressProxy

    problem = bwrap_problem(ShellPolicy())
    if problem:
        raise SystemExit(problem)
    note(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
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
        if options.walk_entries:
            walk(options.walk_entries)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def walk(entries: int) -> None:
    from nexo_django.core.sandboxes.base import DEFAULT_PROTECTED
    from nexo_django.core.sandboxes.guard import Quota, check_after, survey

    root = Path(tempfile.mkdtemp(prefix="nexo-bench-walk-"))
    try:
        for index in range(entries):
            folder = root / f"d{index // 1000}"
            folder.mkdir(exist_ok=True)
            (folder / f"f{index}").write_bytes(b"")
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        quota = Quota(1 << 50, 10 * entries)
        before: list[float] = []
        after: list[float] = []
        for _ in range(5):
            start = time.perf_counter_ns()
            survey(str(root), fd, DEFAULT_PROTECTED, quota, bind=True, owner=None).close()
            before.append(time.perf_counter_ns() - start)
            start = time.perf_counter_ns()
            check_after(str(root), fd, DEFAULT_PROTECTED, quota)
            after.append(time.perf_counter_ns() - start)
        os.close(fd)
        note(f"the walks of one confined call over {entries} entries (5 times each)")
        figure("walk_before_call", entries=entries, median_ms=ms(median(before)), us_per_entry=round(median(before) / entries / 1000, 2))
        figure("walk_after_call", entries=entries, median_ms=ms(median(after)), us_per_entry=round(median(after) / entries / 1000, 2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
