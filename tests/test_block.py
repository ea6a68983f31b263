"""block.py: run names to blocks, the families at BERT's FLOPs, the tables paired by seed; its command line."""
import json
import os
import re
import subprocess
import sys

import pytest

import block
from conftest import script_error
from configurator import UserError
from flops import training_flops
from model import make_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_names_are_blocks():
    assert block.block_of("old") == block.OLD and block.block_of("new") == block.NEW
    assert block.block_of("old+geglu") == {**block.OLD, "mlp": "geglu"}
    assert block.block_of("old+emb_norm") == {**block.OLD, "emb_norm": True}
    assert block.block_of("new-lm_head") == {**block.NEW, "lm_head": False}
    assert block.block_of("new-geglu") == {**block.NEW, "mlp": "gelu"}
    assert block.block_of("crossbert") == block.NEW
    with pytest.raises(UserError, match=re.escape("unknown run 'old+swiglu'")):
        block.block_of("old+swiglu")


def test_families_get_berts_flops():
    bert = block.settings_of("new", "web", 1338)
    assert bert["max_iters"] == 721 and bert["seed"] == 1338 and "max_flops" not in bert
    budget = training_flops(make_config(bert), "bert", 16) * 721
    for family in ("crossbert", "electra"):
        s = block.settings_of(family, "web", 1338)
        assert s["model_type"] == family and "max_iters" not in s and s["max_flops"] == budget


def record(run, seed, val, linear, knn, twin=(60.0, 58.0)):
    scores = lambda lin, kn: {"linear": {"A": lin - 1, "B": lin + 1}, "knn": {"A": kn, "B": kn}}
    return dict(run=run, corpus="web", seed=seed, val_loss=val, unigram=6.4, flops_per_step=4.7e10,
                trained=scores(linear, knn), twin=scores(*twin))


def test_table_pairs_runs_by_seed():
    rs = [record("old", 1, 6.0, 55, 43), record("old", 2, 6.1, 54, 42), record("old", 3, 6.0, 56, 44),
          record("new", 1, 6.1, 60, 44), record("new", 2, 6.1, 60, 43), record("new", 3, 6.2, 61, 45),
          record("peer", 1, 6.2, 61, 44), record("peer", 2, 6.2, 59, 43), record("crossbert", 1, 6.3, 62, 50)]
    text = block.table(rs)
    assert "unigram baseline 6.400" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # new - old: +5, +6, +5 linear -> mean +5.3, sd 0.58, t(2) 4.30: half-width 1.4
    # new - old: val +0.1, 0.0, +0.2 (sd 0.1, t(2) 4.30: half-width 0.248); linear +5, +6, +5; kNN +1 each
    assert "| new − old | 3 | +0.100 [-0.148, +0.348] | +5.3 [+3.9, +6.8] | +1.0 [+1.0, +1.0] |" in text
    assert rows["new − peer"].split(" | ")[1] == "2"  # only the seeds both ran
    assert "peer − old" not in rows and "old − peer" in rows  # each pair once, the peer as the reference
    # CrossBERT at the new BERT's FLOPs: against it (the families at equal FLOPs), the old block and the peer
    assert rows["crossbert − new"].endswith("| +2.0 (1 seed) | +6.0 (1 seed) |")
    assert {"crossbert − old", "crossbert − peer"} <= set(rows) and "new − crossbert" not in rows
    assert "| old | 3 | 47.0 | 6.033 ± 0.058 | 55.0 ± 1.0 | 60.0 ± 0.0 | -5.0 [-7.5, -2.5] |" in text


def test_table_alone_writes_the_tables_from_the_results(tmp_path, capsys):
    results = tmp_path / "block" / "results.jsonl"
    results.parent.mkdir()
    rows = (record("old", 1, 6.0, 55, 43), record("new", 1, 6.1, 60, 44))
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    block.main(["--table", f"--results={results}", f"--work={tmp_path / 'work'}"])  # a bare --flag turns it on
    assert (tmp_path / "block" / "results.md").read_text() == block.table([json.loads(x) for x in open(results)])
    assert "| new − old | 1 |" in capsys.readouterr().out and not (tmp_path / "work").exists()


def test_help_lists_the_settings():
    out = subprocess.run([sys.executable, "experiments/block.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("The block's ablation"), out.stderr
    row = next(line for line in out.stdout.splitlines() if line.split()[:1] == ["--runs=old,new,peer"])
    assert "comma-separated run names" in row and "--table=False" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["--runs=old,old+swiglu"], "--runs: unknown run 'old+swiglu'"),
    (["--seeds=0"], "--seeds=0: must be at least 1"),
    (["--table=yes"], "table must be a bool"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert message in script_error(monkeypatch, capsys, "experiments/block.py", *args, f"--work={out / 'work'}",
                                   f"--results={out / 'results.jsonl'}")
    assert not out.exists()
