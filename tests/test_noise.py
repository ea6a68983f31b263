"""noise.py: the spread of the probe averages over seeds, and the smallest difference it lets a test detect; its
command line."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import noise
from plumbing.checkpoint import save_checkpoint
from model import CrossBERT, ModelConfig
from conftest import script_error
from stats import T95

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_noise_measures_each_source_and_writes_every_score(tmp_path, capsys):
    task = tmp_path / "task"
    task.mkdir()
    for split, n in [("train", 40), ("dev", 20)]:
        rows = ["sentence\tlabel"] + [f"{'good fine' if i % 2 else 'bad awful'} words {i}\t{i % 2}" for i in range(n)]
        (task / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    model = CrossBERT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32))
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, dict(model=model.state_dict(), model_type="crossbert", model_args=vars(model.config),
                               vocab_map=None))
    out = tmp_path / "not" / "yet" / "noise.json"  # its folder is made
    noise.main([f"--like={path}", f"--trained={path},{path}", f"--tasks={task}", "--init_seeds=3",
                "--probe_seeds=2", f"--out={out}"])
    data = json.loads(out.read_text())
    runs = {k: np.array(v) for k, v in data["runs"].items()}
    assert {k: len(v) for k, v in runs.items()} == {"init": 3, "probe": 2, "training": 2}
    assert np.all((0 <= runs["init"]) & (runs["init"] <= 100))
    # the same checkpoint twice: nothing but a seed varies, and here none does
    assert np.array_equal(runs["training"][0], runs["training"][1]) and data["sd"]["training"] == [0.0, 0.0]
    for k in ("init", "probe"):
        assert data["sd"][k] == pytest.approx(runs[k].std(axis=0, ddof=1).tolist())
    # three seeds a side: t(4) x the largest sd x sqrt(2/3)
    worst = np.max([data["sd"][k] for k in data["sd"]], axis=0)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 3 |"))
    assert [float(x) for x in row.strip("|").split("|")[1:]] == pytest.approx(
        [T95[4] * s * math.sqrt(2 / 3) for s in worst], abs=0.006)


def test_help_lists_the_settings():
    out = subprocess.run([sys.executable, "experiments/noise.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("The instrument's noise"), out.stderr
    row = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["--init_seeds=5"])
    assert "random twins of --like" in row


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    ([], "--like: pass a checkpoint"),
    (["--probe_seeds=1"], "--init_seeds and --probe_seeds: at least 2 each"),
    (["--max_train=many"], "max_train must be a int"),
    (["--tasks="], "--tasks is needed: the task folders (train.tsv, dev.tsv) to probe, or a folder of them, e.g. "
                   "--tasks=DIR/devtasks"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch, capsys):
    like = [f"--like={tmp_path / 'ckpt.pt'}"] if args else []  # checked before the checkpoint is read
    assert message in script_error(monkeypatch, capsys, "experiments/noise.py", *like, *args,
                                   f"--out={tmp_path / 'out' / 'noise.json'}")
    assert not (tmp_path / "out").exists()
