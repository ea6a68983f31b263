import contextlib
import io
import os
import runpy
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path[:0] = [str(ROOT), str(ROOT / "experiments"), str(ROOT / "hf"), str(ROOT / "embeddings")]  # the scripts, as `python x.py` finds them
torch.set_num_threads(1)  # the tests use tiny tensors: one thread is faster than two that wait on each other
os.environ["OMP_NUM_THREADS"] = "1"  # and in the scripts they start: two each made a sweep test 5x slower on a busy CPU


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (end-to-end runs: several processes, compilation, whole scripts) run only with RUN_SLOW=1,
    so the default run checks every idea in minutes; CI runs both."""
    if os.environ.get("RUN_SLOW") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture
def shared_dir():
    """The read-only ../shared folder beside the checkout; tests using it skip without it."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not available")
    return SHARED


def assert_one_line_error(main, args, script, *needles):
    """main(args) must stop with exit status 2 and one line `<script>: error: ...` holding every needle."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
        main(args)
    msg = err.getvalue().rstrip("\n")
    assert e.value.code == 2 and msg.startswith(f"{script}: error: ") and "\n" not in msg, msg
    assert all(n in msg for n in needles), msg


def script_error(monkeypatch, capsys, script, *args):
    """`python <script> <args>`, run in this process, must stop with exit status 2 and one line `<script>: error: ...`,
    which it returns. For input refused before a script changes anything a later test would see (train.py: while it
    checks its settings); a subprocess would spend most of its time importing torch again."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # train.py installs its own: restored afterwards
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"{Path(script).name}: error: ") and err.count("\n") == 1, err
    return err


def tiny_tasks(tmp_path):
    """Two small task folders (train.tsv, dev.tsv) whose labels a bag of words separates; a comma-separated list."""
    tasks = []
    for name, words in (("topic", ("sport match goal", "vote law party")), ("mood", ("happy great", "sad awful"))):
        d = tmp_path / name
        d.mkdir()
        for split, n in (("train", 40), ("dev", 20)):
            rows = ["sentence\tlabel"] + [f"{words[i % 2]} number {i}\t{'ab'[i % 2]}" for i in range(n)]
            (d / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        tasks.append(str(d))
    return ",".join(tasks)
