"""The confined shell's reading of the root repository's index (core/sandboxes/gitlinks.py): the
gitlinks git itself lists, in each index version git writes; never through a symbolic link."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nexo_django.core.sandboxes import gitlinks


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(repo), *args], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_gitlinks_are_those_git_lists_in_every_index_version(tmp_path: Path, version: int) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for name in ("a.txt", "deep/er/b.txt", "deep/er/c.txt", "zz.txt"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(name)
    git(repo, "add", "a.txt", "deep", "zz.txt")
    for i, path in enumerate(["deep/er/sub", "lib/vendored", "z"]):
        git(repo, "update-index", "--add", "--cacheinfo", f"160000,{str(i + 1) * 40},{path}")
    (repo / "later.txt").write_text("x")
    git(repo, "add", "-N", "later.txt")  # intent to add: an extended flag (version 3 and up)
    git(repo, "update-index", "--index-version", str(version))
    listed = [line.split("\t", 1)[1] for line in git(repo, "ls-files", "-s").splitlines() if line.startswith("160000 ")]
    assert listed == ["deep/er/sub", "lib/vendored", "z"]
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert gitlinks.registered(fd) == listed
        assert gitlinks.absent(fd, listed) == listed
        (repo / "z" / ".git").mkdir(parents=True)
        assert gitlinks.absent(fd, listed) == ["deep/er/sub", "lib/vendored"]
        [said] = gitlinks.neutralise_new(fd, ["z"])
        assert "'z'" in said and not (repo / "z" / ".git").exists()
    finally:
        os.close(fd)


def test_a_link_on_the_way_is_never_followed(tmp_path: Path) -> None:
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (outside / ".git").mkdir(parents=True)
    repo.mkdir()
    (repo / "lib").symlink_to(outside)
    fd = os.open(repo, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert gitlinks.neutralise_new(fd, ["lib"]) == []
    finally:
        os.close(fd)
    assert (outside / ".git").is_dir()  # what the link points at is untouched


def test_what_is_not_an_index_is_refused() -> None:
    with pytest.raises(ValueError, match="not a git index"):
        gitlinks.parse_index(b"PACK\0\0\0\2")
