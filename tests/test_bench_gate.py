"""make bench's regression gate (bench/regression.py, bench/targets.py): the judging, and the
baseline tree measured beside the working tree in fresh processes, in turns; the peer targets'
judging (bench/peers.py's figures)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import regression
from bench.targets import GATES, evaluate, parse


def test_a_full_regression_over_ten_percent_is_a_gate_miss_and_a_quick_one_is_not_judged():
    lines = [
        "figure=regression check=cycle_postgres key=median_ms baseline=10 now=11.2 ratio=1.120 pairs=3 mode=full",
        "figure=regression check=cycle_postgres key=cpu_median_ms baseline=5 now=5.4 ratio=1.080 pairs=3 mode=full",
        "figure=regression check=cycle_sqlite_wal key=median_ms baseline=5 now=9 ratio=1.800 pairs=1 mode=quick",
    ]
    verdicts = [v for v in evaluate(parse(lines)) if v.startswith("target=no_regression ")]
    assert GATES == ("no_regression",)
    assert len(verdicts) == 2  # the quick figure is a smoke test: judged by nothing
    assert "key=median_ms" in verdicts[0] and verdicts[0].endswith("met=no")
    assert "key=cpu_median_ms" in verdicts[1] and verdicts[1].endswith("met=yes")


def peer_verdicts(lines: list[str]) -> list[str]:
    return [v for v in evaluate(parse(lines)) if v.startswith("target=cycle_vs_best_peer")]


@pytest.mark.parametrize(("ratio", "met"), [("0.691", "no"), ("0.5", "yes"), ("0.45", "yes")])
def test_the_same_database_comparison_on_postgresql_has_a_target_of_its_own(ratio, met):
    line = (
        "figure=cycle_vs_best_peer nexo_db=postgresql-fsync peer_db=postgresql-fsync processes=5 nexo_median_ms=17.7"
        f" best_peer=langgraph best_peer_median_ms=25.6 ratio={ratio} cpu_ratio=0.444"
    )
    verdicts = peer_verdicts([line])
    assert (
        f"target=cycle_vs_best_peer_same_db nexo_db=postgresql-fsync peer_db=postgresql-fsync best_peer=langgraph "
        f"value={ratio} limit<=0.5 met={met}"
    ) in verdicts
    # The comparisons with the peers on SQLite are not judged on it: they were not measured.
    assert [v for v in verdicts if v.startswith("target=cycle_vs_best_peer ")] == [
        "target=cycle_vs_best_peer limit<=0.5 met=not_measured"
    ] * 3


def test_the_peers_on_sqlite_stay_judged_by_the_cross_database_targets_only():
    lines = [
        "figure=cycle_vs_best_peer nexo_db=sqlite-wal-full processes=5 nexo_median_ms=4.8 best_peer=langgraph"
        " best_peer_median_ms=10.8 ratio=0.457 ratio_min=0.423 ratio_max=0.484 cpu_ratio=0.415",
        "figure=cycle_vs_best_peer nexo_db=postgresql-fsync processes=5 nexo_median_ms=10.8 best_peer=langgraph"
        " best_peer_median_ms=11.0 ratio=0.997 ratio_min=0.9 ratio_max=1.1 cpu_ratio=0.488",
    ]
    assert peer_verdicts(lines) == [
        "target=cycle_vs_best_peer nexo_db=sqlite-wal-full best_peer=langgraph value=0.457 limit<=0.5 met=yes",
        "target=cycle_vs_best_peer nexo_db=postgresql-fsync best_peer=langgraph value=0.997 limit<=0.5 met=no",
        "target=cycle_vs_best_peer_same_db limit<=0.5 met=not_measured",
        "target=cycle_vs_best_peer limit<=0.5 met=not_measured",
        "target=cycle_vs_best_peer_same_db limit<=0.5 met=not_measured",
    ]


def test_nexo_with_prepared_statements_is_judged_apart_from_djangos_default_binding():
    """`postgres-prepared` (a configuration docs/deployment.md recommends where the connections
    allow it) has targets of its own: its figures never stand in for the default's."""
    lines = [
        "figure=cycle_vs_best_peer nexo_db=postgresql-fsync-prepared processes=5 nexo_median_ms=6.1 best_peer=langgraph"
        " best_peer_median_ms=12.0 ratio=0.508 cpu_ratio=0.4",
        "figure=cycle_vs_best_peer nexo_db=postgresql-fsync-prepared peer_db=postgresql-fsync processes=5"
        " nexo_median_ms=6.1 best_peer=pydantic_ai best_peer_median_ms=12.5 ratio=0.488 cpu_ratio=0.4",
    ]
    assert peer_verdicts(lines) == [
        "target=cycle_vs_best_peer limit<=0.5 met=not_measured",
        "target=cycle_vs_best_peer limit<=0.5 met=not_measured",
        "target=cycle_vs_best_peer_same_db limit<=0.5 met=not_measured",
        "target=cycle_vs_best_peer nexo_db=postgresql-fsync-prepared best_peer=langgraph value=0.508 limit<=0.5 met=no",
        "target=cycle_vs_best_peer_same_db nexo_db=postgresql-fsync-prepared peer_db=postgresql-fsync"
        " best_peer=pydantic_ai value=0.488 limit<=0.5 met=yes",
    ]
    floors = [v for v in evaluate(parse([
        "figure=cycle_over_floor db=postgresql-fsync-prepared start=run cycle_median_ms=6.4 floor_ms=2.84 multiple=2.25",
    ])) if v.startswith("target=cycle_over_commit_floor")]  # fmt: skip
    assert floors == [
        "target=cycle_over_commit_floor limit<=3 met=not_measured",
        "target=cycle_over_commit_floor limit<=3 met=not_measured",
        "target=cycle_over_commit_floor db=postgresql-fsync-prepared cycle_median_ms=6.4 floor_ms=2.84 value=2.25"
        " limit<=3 met=yes",
    ]


def test_bench_peers_prints_the_verdict_of_the_figure_it_printed(capsys):
    from bench.peers import print_verdict

    print_verdict("postgresql-fsync", "langgraph", "0.691", "postgresql-fsync")
    print_verdict("postgresql-fsync", "langgraph", "0.997")
    assert capsys.readouterr().out.splitlines() == [
        "target=cycle_vs_best_peer_same_db nexo_db=postgresql-fsync peer_db=postgresql-fsync best_peer=langgraph"
        " value=0.691 limit<=0.5 met=no",
        "target=cycle_vs_best_peer nexo_db=postgresql-fsync best_peer=langgraph value=0.997 limit<=0.5 met=no",
    ]


def tree_with_probe(root: Path, value: float) -> Path:
    root.mkdir()
    (root / "probe_bench.py").write_text(
        "import os, sys\n"
        "with open(os.environ['PROBE_LOG'], 'a') as log:\n"
        "    log.write(os.path.basename(os.getcwd()) + '\\n')\n"
        f"print('figure=probe side=x other=1 value={value}')\n"
    )
    return root


def test_baseline_and_working_tree_take_turns_in_fresh_processes_and_are_compared(tmp_path, monkeypatch):
    base = tree_with_probe(tmp_path / "base", 4.0)
    now = tree_with_probe(tmp_path / "now", 5.0)
    log = tmp_path / "order.log"
    monkeypatch.setenv("PROBE_LOG", str(log))
    monkeypatch.setattr(regression, "ROOT", now)
    check = regression.Check("probe", ("probe_bench",), (), "probe", ("value",), {"side": "x"})

    before, after = regression.interleaved(check, base, pairs=2, quick=False)

    assert log.read_text().split() == ["base", "now", "now", "base"]  # ABBA: drift falls on both
    assert before == [{"value": 4.0}, {"value": 4.0}] and after == [{"value": 5.0}, {"value": 5.0}]
    baseline, current, ratio = regression.ratios(check, before, after)["value"]
    assert (baseline, current) == (4.0, 5.0) and ratio == pytest.approx(1.25)


def test_a_figure_missing_from_the_output_is_an_error_not_a_pass(tmp_path, monkeypatch):
    base = tree_with_probe(tmp_path / "base", 4.0)
    monkeypatch.setenv("PROBE_LOG", str(tmp_path / "order.log"))
    check = regression.Check("probe", ("probe_bench",), (), "probe", ("value",), {"side": "y"})
    with pytest.raises(RuntimeError, match="no figure=probe"):
        regression.measure(check, base, quick=False)


def test_an_unknown_baseline_revision_names_the_refresh(tmp_path):
    with pytest.raises(SystemExit, match="--refresh"):
        regression.export_tree("0" * 40, tmp_path)


def test_the_stored_baselines_name_revisions_of_this_repository():
    baselines = regression.load_baselines()
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=regression.ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    for klass, entry in baselines["classes"].items():
        assert len(entry["revision"]) == 40, klass
        assert set(entry["figures"]) == {c.name for c in regression.CHECKS}, klass
        if shallow == "false":  # a shallow clone may not hold it (the gate then says so)
            found = subprocess.run(
                ["git", "cat-file", "-e", f"{entry['revision']}^{{commit}}"], cwd=regression.ROOT, check=False
            )
            assert found.returncode == 0, f"{klass}: {entry['revision']} is not a commit here"


@pytest.mark.parametrize("how", ["fails", "hangs"])
def test_a_benchmark_that_fails_or_hangs_is_an_error_and_its_whole_output_is_kept(tmp_path, monkeypatch, how):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "noisy_bench.py").write_text(
        "import sys, time\n"
        "for i in range(40):\n"
        "    print(f'worker log line {i}', flush=True)\n"
        f"{'time.sleep(30)' if how == 'hangs' else 'sys.exit(3)'}\n"
    )
    monkeypatch.setattr(regression, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(regression, "STEP_TIMEOUT", 2)
    check = regression.Check("noisy", ("noisy_bench",), (), "probe", ("value",), {})
    with pytest.raises(RuntimeError, match="longer than 2 s" if how == "hangs" else "exited with 3") as raised:
        regression.measure(check, tree, quick=False)
    message = str(raised.value)
    assert "worker log line 39" in message and "worker log line 0\n" not in message  # the tail only
    [kept] = (tmp_path / "results").iterdir()
    assert f"(the whole output: {kept})" in message
    assert kept.read_text().splitlines()[:40] == [f"worker log line {i}" for i in range(40)]


def test_a_run_without_the_gate_has_no_regression_and_a_miss_is_one():
    """`bench/run.py --only ...` without the regression step prints the gate `not_measured`: that
    is no regression (it made such runs exit 1, "1 figure(s) regressed"); `met=no` is."""
    from bench.targets import gate_misses

    assert gate_misses(evaluate(parse(["figure=peer_cycle framework=langgraph median_ms=12"]))) == []
    miss = ("figure=regression check=cycle_postgres key=median_ms baseline=7 now=8 ratio=1.143 pairs=6"
            " baseline_revision=x mode=full")
    assert gate_misses(evaluate(parse([miss]))) == [
        "target=no_regression check=cycle_postgres key=median_ms baseline=7 now=8 pairs=6 value=1.143 limit<=1.1 met=no"
    ]
