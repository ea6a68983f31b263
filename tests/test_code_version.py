"""checkpoint.code_version(): the code a result comes from, in a git checkout and in a copy without git."""
import shutil
import subprocess
from pathlib import Path

import pytest

from plumbing import checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_in_a_checkout_it_is_the_commit_and_whether_the_tree_is_dirty():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    version = checkpoint.code_version.__wrapped__()  # not the cached answer
    assert version.keys() == {"commit", "dirty"} and isinstance(version["dirty"], bool)
    assert len(version["commit"]) == 40 and set(version["commit"]) <= set("0123456789abcdef")


@pytest.mark.parametrize("without", ["a .git folder", "git itself"])
def test_outside_git_it_is_a_hash_of_the_root_python_files(tmp_path, monkeypatch, without):
    # a copy of the root .py files (as one unpacked from an archive), which checkpoint.py reads as its own folder
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tmp_path)
    (tmp_path / "plumbing").mkdir()
    monkeypatch.setattr(checkpoint, "__file__", str(tmp_path / "plumbing" / "checkpoint.py"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above the copy counts
    if without == "git itself":
        def no_git(*args, **kwargs):
            raise FileNotFoundError(2, "No such file or directory", "git")
        monkeypatch.setattr(subprocess, "run", no_git)
    version = checkpoint.code_version.__wrapped__
    first = version()
    assert first.keys() == {"sha256"} and len(first["sha256"]) == 64
    assert version() == first  # the same files, the same hash
    model = tmp_path / "model.py"
    text = model.read_text()
    model.write_text(text + "# a change\n")
    changed = version()
    assert changed != first
    model.write_text(text)
    assert version() == first
    (tmp_path / "extra.py").write_text("")  # a new root file is new code too
    assert version() not in (first, changed)
