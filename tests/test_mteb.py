import json

import pytest
import torch

pytest.importorskip("mteb")
import embed  # noqa: E402  (after the skip: without mteb there is nothing to test here)
from configurator import UserError  # noqa: E402
from embeddings.vectors import zero_shot_sts  # noqa: E402
from evaluation.features import Backbone  # noqa: E402
from model import CrossBERT, ModelConfig  # noqa: E402

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)


@pytest.mark.slow
def test_glue_sts_b_through_mteb_equals_our_zero_shot_score(shared_dir, tmp_path):
    sts = shared_dir / "glue" / "STS-B"
    torch.manual_seed(0)
    model = Backbone(CrossBERT(ModelConfig(**TINY))).eval()  # as embed.py loads it
    tasks = embed.mteb_tasks(str(sts))  # loaded from the local dev.tsv, no hub
    assert [t.metadata.name for t in tasks] == ["STS-B"] and len(tasks[0].dataset["test"]) == 1500
    scores = embed.mteb_scores(model, None, tasks, tmp_path, "crossbert/zero-shot", "random")
    ours = zero_shot_sts(model, sts)
    assert 5 < abs(ours) < 100 and scores == {"mteb/STS-B": pytest.approx(ours, abs=1e-6)}
    saved = json.loads((tmp_path / "results/crossbert__zero-shot/random/STS-B.json").read_text())  # mteb's layout
    assert saved["scores"]["test"][0]["cosine_spearman"] == pytest.approx(ours / 100, abs=1e-6)


@pytest.mark.slow
def test_command_line_scores_every_row_through_mteb(tmp_path, capsys):
    (tmp_path / "sts.tsv").write_text("".join(f"{i % 5}\tsentence number {i}\tsentence {i * 7 % 11}\n" for i in range(20)))
    (tmp_path / "pairs.tsv").write_text("".join(f"question {i}\tanswer {i}\n" for i in range(40)))
    sts = str(tmp_path / "sts.tsv")
    embed.main(["--ckpt=random", *[f"--{k}={v}" for k, v in TINY.items()], f"--sts={sts}", f"--mteb={sts}",
                f"--mteb_out={tmp_path / 'mteb'}", f"--pairs={tmp_path / 'pairs.tsv'}", "--steps=2", "--batch_size=8",
                f"--out={tmp_path / 'out.json'}"])
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["zero-shot", "frozen (attn pooler)"]
    for r in rows:  # mteb's evaluator and ours agree, with and without the trained pooler
        assert r["scores"]["mteb/sts"] == pytest.approx(r["scores"]["sts"], abs=1e-6)
    assert rows[0]["scores"]["sts"] != rows[1]["scores"]["sts"]
    for row in ("zero-shot", "frozen"):
        assert (tmp_path / "mteb" / "results" / f"crossbert-2x32__{row}" / "random" / "sts.json").is_file()


def test_unknown_task_is_a_clear_error():
    with pytest.raises(UserError, match="no mteb task 'NoSuchTask' and no such path"):
        embed.mteb_tasks("NoSuchTask")
