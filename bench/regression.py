"""The regression gate of ``make bench`` (issue 34, item 3): nothing gets slower unnoticed.

The stored baseline (``bench/baselines.json``) names, per machine class (the CPU's model and the
number of cores), a revision of this repository and the figures it gave when it was stored. The
gate does not compare today's figures with those stored numbers: this project's machines differ
by up to 2x from one session to the next, far more than the 10 % it must notice. It measures
**the baseline revision and the working tree interleaved**, in one run on one machine: the
baseline's tree is exported from git (``git archive``) into a temporary directory, and each
check's benchmark runs in fresh processes, baseline and working tree taking turns (ABBA, so a
drift of the machine falls on both sides), with the same virtual environment and servers. Per
check and figure the median of each side's processes is taken and ``ratio = now / baseline``;
a ratio above ``LIMIT`` (1.10) is a regression. A check over the limit is measured again with as
many pairs more and judged on all of them, so one unlucky process does not fail the run.

The figures gated: the approval cycle's median wall time and median CPU time on SQLite (WAL,
``synchronous=FULL``) and on PostgreSQL (fsync on), and the concurrent worker's CPU per run
(``bench/concurrency.py``, nexo's side alone).

    python -m bench.regression [--pairs 3] [--quick] [--only CHECK]   # the gate (run.py runs it)
    python -m bench.regression --refresh                               # store HEAD as the baseline

Prints ``figure=regression check=... key=... baseline=... now=... ratio=... pairs=...`` per
figure; bench/targets.py judges them (``target=no_regression``) and bench/run.py exits non-zero
when one is over the limit. Without a baseline for this machine class it prints
``figure=regression_baseline status=missing`` and the command that stores one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "bench" / "baselines.json"
LIMIT = 1.10
STEP_TIMEOUT = 240  # seconds per benchmark process
#: where a failed benchmark's whole output is kept (git ignores it)
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Check:
    name: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    figure: str
    keys: tuple[str, ...]
    select: dict[str, str] = field(default_factory=dict)


CHECKS = (
    Check("cycle_sqlite_wal", ("bench.approval_cycle", "--db", "sqlite-wal-full", "--cycles", "200"),
          ("--cycles", "30"), "approval_cycle", ("median_ms", "cpu_median_ms")),
    Check("cycle_postgres", ("bench.approval_cycle", "--db", "postgres", "--cycles", "200"),
          ("--cycles", "30"), "approval_cycle", ("median_ms", "cpu_median_ms")),
    Check("worker_cpu_per_run", ("bench.concurrency", "--skip", "peer", "--skip", "simple"),
          ("--runs", "100"), "concurrency", ("cpu_ms_per_run",), {"side": "nexo_concurrent_worker"}),
)  # fmt: skip


def machine_class() -> str:
    """The CPU's model and the number of cores: figures are only compared within one class."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{' '.join(model.split())} x{os.cpu_count()}"


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench.regression: git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def load_baselines() -> dict:
    if not BASELINES.exists():
        return {"classes": {}}
    return json.loads(BASELINES.read_text())


def export_tree(revision: str, into: Path) -> Path:
    """The baseline revision's files (``git archive``), without touching the working tree."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode:
        raise SystemExit(
            f"bench.regression: the baseline revision {revision} is not in this clone "
            f"({archive.stderr.decode().strip()}): fetch it, or store a new baseline "
            "with `python -m bench.regression --refresh` (bench/README.md)"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def parse_figures(output: str, check: Check) -> dict[str, float]:
    for line in output.splitlines():
        if not line.startswith(f"figure={check.figure} "):
            continue
        pairs = dict(item.split("=", 1) for item in line.split() if "=" in item)
        if all(pairs.get(k) == v for k, v in check.select.items()) and all(k in pairs for k in check.keys):
            return {key: float(pairs[key]) for key in check.keys}
    raise RuntimeError(f"no figure={check.figure} with {', '.join(check.keys)} in its output")


def measure(check: Check, tree: Path, quick: bool) -> dict[str, float]:
    """One fresh process of the check's benchmark, run from ``tree`` (its own nexo_django first
    on the path: the editable install's finder comes after the path entries)."""
    argv = [sys.executable, "-m", *check.args, *(check.quick if quick else ())]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else str(part or "")
                         for part in (exc.stdout, exc.stderr))
        raise RuntimeError(f"{' '.join(argv[2:])} in {tree} ran longer than {STEP_TIMEOUT} s:\n"
                           f"{kept(check, output)}") from None
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv[2:])} in {tree} exited with {done.returncode}:\n"
                           f"{kept(check, done.stdout + done.stderr)}")
    return parse_figures(done.stdout, check)


def kept(check: Check, output: str) -> str:
    """The last lines of a failed benchmark's output, and where the whole of it is kept (a hang's
    workers' logs and threads' stacks are longer than a screen)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"regression-{check.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    path.write_text(output)
    return "\n".join(output.splitlines()[-15:]) + f"\n(the whole output: {path})"


def interleaved(check: Check, base: Path, pairs: int, quick: bool) -> tuple[list[dict], list[dict]]:
    """``pairs`` pairs of processes, ABBA: baseline, now, now, baseline, ..."""
    before: list[dict] = []
    now: list[dict] = []
    for i in range(pairs):
        order = [(base, before), (ROOT, now)]
        for tree, sink in order if i % 2 == 0 else reversed(order):
            sink.append(measure(check, tree, quick))
            print(f"# {check.name} {'baseline' if tree == base else 'now'}: {sink[-1]}", file=sys.stderr, flush=True)
    return before, now


def ratios(check: Check, before: list[dict], now: list[dict]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for key in check.keys:
        b = statistics.median(f[key] for f in before)
        n = statistics.median(f[key] for f in now)
        out[key] = (b, n, n / b if b else float("inf"))
    return out


def gate(args: argparse.Namespace) -> int:
    baselines = load_baselines()
    klass = machine_class()
    entry = baselines["classes"].get(klass)
    if entry is None:
        print(f"figure=regression_baseline status=missing machine_class={klass.replace(' ', '_')}")
        print(
            f"# no baseline for this machine class ({klass}) in {BASELINES.relative_to(ROOT)}: "
            "store one with `python -m bench.regression --refresh` (bench/README.md)",
            file=sys.stderr,
        )
        return 0
    revision = entry["revision"]
    print(f"figure=regression_baseline status=found revision={revision[:12]} stored={entry['stored']}")
    checks = [c for c in CHECKS if not args.only or c.name in args.only]
    with tempfile.TemporaryDirectory(prefix="nexo-baseline-") as tmp:
        base = export_tree(revision, Path(tmp))
        for check in checks:
            before, now = interleaved(check, base, args.pairs, args.quick)
            judged = ratios(check, before, now)
            if any(ratio > LIMIT for _, _, ratio in judged.values()) and not args.quick:
                print(f"# {check.name}: over {LIMIT} after {args.pairs} pairs: {args.pairs} more", file=sys.stderr)
                more_before, more_now = interleaved(check, base, args.pairs, args.quick)
                before, now = before + more_before, now + more_now
                judged = ratios(check, before, now)
            for key, (b, n, ratio) in judged.items():
                print(
                    f"figure=regression check={check.name} key={key} baseline={b:.3g} now={n:.3g} "
                    f"ratio={ratio:.3f} pairs={len(now)} baseline_revision={revision[:12]} "
                    f"mode={'quick' if args.quick else 'full'}",
                    flush=True,
                )
    return 0


def refresh(args: argparse.Namespace) -> int:
    """Store HEAD as this machine class's baseline, with its figures (for the record: the gate
    measures the revision again beside the working tree each time)."""
    if git("status", "--porcelain", "--", "nexo_django", "bench", "tests"):
        raise SystemExit("bench.regression --refresh: commit first (the baseline is a revision, not a dirty tree)")
    revision = git("rev-parse", "HEAD")
    figures: dict[str, dict[str, float]] = {}
    for check in CHECKS:
        runs = [measure(check, ROOT, args.quick) for _ in range(args.pairs)]
        figures[check.name] = {k: round(statistics.median(r[k] for r in runs), 3) for k in check.keys}
        print(f"# {check.name}: {figures[check.name]}", file=sys.stderr, flush=True)
    baselines = load_baselines()
    baselines["classes"][machine_class()] = {
        "revision": revision,
        "stored": datetime.now(UTC).date().isoformat(),
        "python": platform.python_version(),
        "load_at_end": "/".join(f"{v:.2f}" for v in os.getloadavg()),
        "figures": figures,
    }
    BASELINES.write_text(json.dumps(baselines, indent=2, sort_keys=True) + "\n")
    print(f"stored {revision[:12]} for {machine_class()} in {BASELINES.relative_to(ROOT)}: commit it")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="baseline/now process pairs per check")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the gate, not a verdict")
    parser.add_argument("--only", action="append", choices=[c.name for c in CHECKS])
    parser.add_argument("--refresh", action="store_true", help="store HEAD as this machine class's baseline")
    args = parser.parse_args()
    if not os.environ.get("BENCH_PG_URL"):  # one PostgreSQL (fsync on) for every process, as run.py does
        sys.path.insert(0, str(ROOT))
        from tests.servers import PostgresServer

        server = PostgresServer(database="bench", fsync=True).start()
        os.environ["BENCH_PG_URL"] = server.url
    try:
        return refresh(args) if args.refresh else gate(args)
    except RuntimeError as exc:  # a benchmark that failed or hung: no verdict, and make bench fails
        print(f"bench.regression: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    if shutil.which("git") is None:
        raise SystemExit("bench.regression needs git (the baseline is a revision)")
    sys.exit(main())
