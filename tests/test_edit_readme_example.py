"""example_project/edit_readme.py, run as a user would, in a subprocess, with its scripted model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "example_project" / "edit_readme.py"
TYPO = "# Notes\n\nThis is teh readme.\n"


def run_script(folder: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "NEXO_MODEL")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=folder,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_scripted_edit_readme_with_yes_fixes_the_typo(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(TYPO)
    done = run_script(tmp_path, "--yes")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "README.md").read_text() == "# Notes\n\nThis is the readme.\n"
    assert "scripted" in done.stdout
    assert "Allow?" in done.stdout


def test_scripted_edit_readme_answered_no_leaves_the_file(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(TYPO)
    done = run_script(tmp_path, stdin="n\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "README.md").read_text() == TYPO
    assert "said no" in done.stdout


def test_scripted_edit_readme_answered_yes_on_stdin(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(TYPO)
    done = run_script(tmp_path, stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "README.md").read_text() == "# Notes\n\nThis is the readme.\n"


def test_scripted_edit_readme_with_no_answer_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(TYPO)
    done = run_script(tmp_path)  # stdin is empty: EOF is a no
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "README.md").read_text() == TYPO


def test_scripted_edit_readme_touches_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(TYPO)
    run_script(tmp_path, "--yes")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


def test_edit_readme_without_a_readme_says_how_to_try_it(tmp_path: Path) -> None:
    done = run_script(tmp_path, "--yes")
    assert done.returncode == 2
    assert "--demo" in done.stderr


def test_scripted_edit_readme_demo_works_in_a_temp_folder(tmp_path: Path) -> None:
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "NEXO_MODEL")}
    env["PYTHONPATH"] = str(ROOT)
    env["TMPDIR"] = str(env_tmp)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--demo", "--yes"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [demo] = list(env_tmp.iterdir())
    assert (demo / "README.md").read_text() == "# Demo\n\nThis is the demo project. You will receive a fixed copy.\n"
    assert list(workdir.iterdir()) == []
