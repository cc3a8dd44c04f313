"""unimodal.core.provenance: a report names the code that wrote it (version, commit, modified tracked files)."""

import shutil
import subprocess

import pytest

import unimodal
from unimodal.core.provenance import code_version


def test_outside_a_git_checkout_only_the_version_is_known(tmp_path):
    assert code_version(tmp_path) == {"version": unimodal.__version__, "commit": None, "modified": None}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_checkout_names_its_commit_and_whether_tracked_files_changed(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "first")
    head = git("rev-parse", "HEAD")
    assert code_version(tmp_path) == {"version": unimodal.__version__, "commit": head, "modified": False}
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert code_version(tmp_path)["modified"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"version": unimodal.__version__, "commit": head, "modified": True}
