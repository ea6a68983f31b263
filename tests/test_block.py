import re

import pytest

import block
from flops import training_flops
from model import make_config


def test_run_names_are_blocks():
    assert block.block_of("old") == block.OLD and block.block_of("new") == block.NEW
    assert block.block_of("old+geglu") == {**block.OLD, "mlp": "geglu"}
    assert block.block_of("old+emb_norm") == {**block.OLD, "emb_norm": True}
    assert block.block_of("new-lm_head") == {**block.NEW, "lm_head": False}
    assert block.block_of("new-geglu") == {**block.NEW, "mlp": "gelu"}
    assert block.block_of("crossbert") == block.NEW
    with pytest.raises(SystemExit, match=re.escape("unknown run 'old+swiglu'")):
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
