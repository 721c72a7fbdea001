"""What the package index receives: an sdist and a wheel that hold everything the app needs, a
README whose links work off the repository, and the CI entry point's apt calls."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# What a fresh clone lacks (.gitignore), copied for nothing: the matrix's venvs alone are some
# 60,000 files, still being written while `make test` builds here.
SKIP = (".venv", ".venv-*", ".git", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache",
        ".grimp_cache", ".test-results", "build", "dist", "*.egg-info", "artifacts", "db.sqlite3", "demo_workspace",
        ".coverage*")

BUILD = """
import sys
from setuptools import build_meta
kind, out = sys.argv[1], sys.argv[2]
print((build_meta.build_sdist if kind == "sdist" else build_meta.build_wheel)(out))
"""


def _build(kind: str, source: Path, out: Path) -> Path:
    # setuptools' PEP 517 backend, called directly: no build isolation, so no network either.
    done = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=source, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], str]:
    """The sdist built from a copy of the tree, then the wheel built from the unpacked sdist (as
    an installer does): whatever the sdist forgets, the wheel lacks too."""
    root = tmp_path_factory.mktemp("build")
    source = root / "src"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(*SKIP))
    (root / "out").mkdir()
    sdist = _build("sdist", source, root / "out")
    with tarfile.open(sdist) as tar:
        sdist_names = tar.getnames()
        tar.extractall(root / "unpacked", filter="data")
    [unpacked] = (root / "unpacked").iterdir()
    wheel = _build("wheel", unpacked, root / "out")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = zf.read(metadata).decode()
    return sdist_names, names, meta


def test_the_wheel_holds_py_typed_templates_static_and_the_license(built: tuple[list[str], list[str], str]) -> None:
    _, names, _ = built
    assert "nexo_django/py.typed" in names
    assert "nexo_django/templates/admin/nexo_django/pendingapproval/decision.html" in names
    assert "nexo_django/templates/nexo_django/run_detail.html" in names
    assert "nexo_django/static/nexo_django/admin.css" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "nexo_django/migrations/0001_initial.py" in names
    assert not [n for n in names if n.startswith(("tests/", "example_project/", "bench/"))]


def test_the_sdist_holds_the_license_and_the_readme(built: tuple[list[str], list[str], str]) -> None:
    sdist_names, _, _ = built
    assert any(n.endswith("/LICENSE") for n in sdist_names)
    assert any(n.endswith("/README.md") for n in sdist_names)
    assert any(n.endswith("/nexo_django/py.typed") for n in sdist_names)


def test_the_metadata_has_the_license_classifiers_urls_and_the_readme(built: tuple[list[str], list[str], str]) -> None:
    _, _, meta = built
    assert "License-Expression: MIT" in meta
    assert "Classifier: Framework :: Django :: 6.0" in meta
    assert "Classifier: Typing :: Typed" in meta
    assert f"Project-URL: Repository, {PYPROJECT['project']['urls']['Repository']}" in meta
    assert "Description-Content-Type: text/markdown" in meta
    assert "## In a Django project" in meta


def test_readme_links_and_images_are_absolute_and_start_with_the_repository_url() -> None:
    repository = PYPROJECT["project"]["urls"]["Repository"]
    raw = repository.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
    readme = (REPO_ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(targets) >= 10
    relative = [t for t in targets if not t.startswith(("https://", "#"))]
    assert relative == [], "the package index's page cannot follow relative links"
    for target in targets:
        assert target.startswith((repository + "/", raw)), target
    for address in re.findall(r"https://(?:github\.com|raw\.githubusercontent\.com)/[^\s)\"]+", readme):
        assert address.startswith((repository, raw)), f"{address} is not under {repository}"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert images and all(i.startswith(raw) for i in images)
    for target in targets:
        path = target.removeprefix(raw).removeprefix(repository + "/blob/main/").removeprefix(repository + "/tree/main/")
        if not path.startswith("https://"):
            assert (REPO_ROOT / path).exists(), f"{target} points at no file of the repository"


def test_build_output_is_ignored_by_git() -> None:
    for path in ("build/lib/x.py", "dist/nexo_django-0.1.0.tar.gz"):
        checked = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT)
        assert checked.returncode == 0, f"{path} is not ignored"


def test_ci_installs_without_recommends_and_waits_for_the_dpkg_lock(tmp_path: Path) -> None:
    """.ci/run on a machine with none of the servers: a fake apt-get records what it is asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "make").write_text("#!/bin/sh\nexit 0\n")
    for fake in ("apt-get", "make"):
        (bin_dir / fake).chmod(0o755)
    os.symlink(shutil.which("dirname") or "/usr/bin/dirname", bin_dir / "dirname")
    os.symlink(shutil.which("sed") or "/usr/bin/sed", bin_dir / "sed")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    script = (REPO_ROOT / ".ci" / "run").read_text()
    # Pretend PostgreSQL is missing too, wherever this test runs.
    (tmp_path / "run").write_text(script.replace("/usr/lib/postgresql/15/bin/postgres", str(tmp_path / "no-postgres")))
    (tmp_path / ".ci").mkdir()
    shutil.move(tmp_path / "run", tmp_path / ".ci" / "run")
    done = subprocess.run(["/bin/bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    update, install = log.read_text().splitlines()
    for line in (update, install):
        assert re.search(r"-o DPkg::Lock::Timeout=\d+", line), line
    assert "update" in update
    assert "install" in install and "--no-install-recommends" in install and "-y" in install
    assert install.split()[-7:] == ["redis-server", "postgresql-15", "chromium", "chromium-driver", "bubblewrap",
                                    "libseccomp2", "util-linux"]


JUNIT = """<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" errors="0" skipped="{skipped}"
 time="1.5"></testsuite></testsuites>"""


def test_the_total_ends_with_passed_and_failed_alone_on_the_last_line(tmp_path: Path) -> None:
    (tmp_path / "sqlite.xml").write_text(JUNIT.format(tests=10, failures=2, skipped=1))
    (tmp_path / "postgres.xml").write_text(JUNIT.format(tests=5, failures=0, skipped=0))
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "total"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-2:] == ["total over every run (1 skipped):", "12 passed, 2 failed"]


def test_ci_ends_with_the_total_and_fails_when_a_test_failed(tmp_path: Path) -> None:
    """.ci/run over a make test whose tests failed: make's own Error line, printed after the
    total, is left out, and the exit status is kept."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(
        "#!/bin/sh\necho 'every pytest run of make test:'\necho 'total over every run (0 skipped):'\n"
        "echo '3 passed, 1 failed'\necho 'make: *** [Makefile:70: test] Error 1' >&2\nexit 2\n"
    )
    (bin_dir / "make").chmod(0o755)
    for tool in ("dirname", "sed", "grep", "redis-server", "chromium", "chromedriver", "bwrap", "prlimit", "setpriv"):
        os.symlink(shutil.which(tool) or "/bin/true", bin_dir / tool)
    # .ci/run asks ldconfig whether libseccomp is there: it is, say so.
    (bin_dir / "ldconfig").write_text("#!/bin/sh\necho 'libseccomp.so.2 (libc6,x86-64) => /lib/libseccomp.so.2'\n")
    (bin_dir / "ldconfig").chmod(0o755)
    (tmp_path / ".ci").mkdir()
    script = (REPO_ROOT / ".ci" / "run").read_text().replace("/usr/lib/postgresql/15/bin/postgres", "/bin/true")
    (tmp_path / ".ci" / "run").write_text(script)
    done = subprocess.run(["/bin/bash", str(tmp_path / ".ci" / "run")], env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout.splitlines()[-1] == "3 passed, 1 failed"
    assert "Error" not in done.stdout + done.stderr


def test_the_classifiers_list_exactly_the_tested_matrix() -> None:
    """scripts/matrix's cells plus the main venv (the newest Python and Django) are what the
    classifiers claim: no more, no fewer."""
    cells_line = next(
        line for line in (REPO_ROOT / "scripts" / "matrix").read_text().splitlines()
        if line.startswith("[ ${#cells[@]} -gt 0 ] || cells=(")
    )
    cells = re.findall(r"(\d+\.\d+):(\d+\.\d+)", cells_line)
    pythons = {py for py, _ in cells}
    djangos = {dj for _, dj in cells}
    main = (max(pythons, key=lambda v: tuple(map(int, v.split(".")))),
            max(djangos, key=lambda v: tuple(map(int, v.split(".")))))
    tested = set(cells) | {main}
    assert tested == {(py, dj) for py in pythons for dj in djangos}  # every Django on every Python
    classifiers = PYPROJECT["project"]["classifiers"]
    claimed_py = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    claimed_dj = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)}
    assert claimed_py == pythons
    assert claimed_dj == djangos
    assert PYPROJECT["project"]["requires-python"] == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"


def test_the_worker_extra_is_hiredis_and_this_suites_workers_parse_with_it() -> None:
    """The `worker` extra is what the test extra installs for it, and redis-py took it: the suite's
    workers run on the C parser (rq's own worker tests run on the Python one: see
    tests/test_rq_worker_suite.py)."""
    import redis.connection

    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["worker"] == ["hiredis>=3,<4"]
    assert set(extras["worker"]) <= set(extras["test"])
    assert redis.connection.DefaultParser.__name__ == "_HiredisParser"
