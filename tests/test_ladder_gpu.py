"""ladder_gpu.py: the prepared GPU command's plan and deadline arithmetic, its pack, and --smoke (the whole path on
tiny runs on the CPU); bad input in one line."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import script_error, tiny_tasks
from data.loader import load_splits
from data.pack import pack_corpus, pack_tasks, unpack_corpus, unpack_tasks
from data.tasks import load_task
from configurator import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_plan_is_seed_0_of_each_family_first_and_electra_last():
    from ladder_gpu import queue
    from runs import PRESETS
    p = dict(PRESETS["ladder"], sizes=[(6, 384, 6)], flops=[0])
    s = dict(families="bert,crossbert,electra", seeds=3)
    names = [n for n, *_ in queue(s, p, p["sizes"], done={"bert-6x384-s1"})]
    assert names == ["bert-6x384", "crossbert-6x384", "crossbert-6x384-s1", "bert-6x384-s2", "crossbert-6x384-s2",
                     "electra-6x384", "electra-6x384-s1", "electra-6x384-s2"]
    runs = {n: rs for n, _, rs, _ in queue(s, p, p["sizes"], done=set())}
    # the ladder's recipe: 20 tokens per BERT parameter (13.9M parameters), FLOP-matched families, seeds 1337 + k
    bert, cross = runs["bert-6x384"], runs["crossbert-6x384-s2"]
    assert bert["max_flops"] == cross["max_flops"] == pytest.approx(1.98e16, rel=0.01)
    assert (bert["seed"], cross["seed"]) == (1337, 1339) and bert["learning_rate"] == cross["learning_rate"]
    # at several multipliers of the law: each seed's runs at every one (the lr axis's names) before the next seed's
    s = dict(s, families="bert,crossbert", seeds=2)
    runs = queue(s, p, p["sizes"], done={"crossbert-6x384-lr2"}, lr_scales=[1.0, 2.0])
    assert [(n, m) for n, _, _, m in runs] == [
        ("bert-6x384", 1.0), ("crossbert-6x384", 1.0), ("bert-6x384-lr2", 2.0), ("bert-6x384-s1", 1.0),
        ("crossbert-6x384-s1", 1.0), ("bert-6x384-lr2-s1", 2.0), ("crossbert-6x384-lr2-s1", 2.0)]
    law, twice = runs[0][2], runs[2][2]
    assert twice == dict(law, learning_rate=2 * law["learning_rate"], min_lr=2 * law["min_lr"])
    # the baseline, BERT's 80/10/10 (the sweep's replace axis and names), beside all-<mask> BERT (a plain name)
    s = dict(s, families="bert-801010,crossbert,bert", seeds=1)
    runs = {n: rs for n, _, rs, _ in queue(s, p, p["sizes"], done=set(), lr_scales=[2.0])}
    assert list(runs) == ["bert-6x384-lr2-801010", "crossbert-6x384-lr2", "bert-6x384-lr2"]
    assert runs["bert-6x384-lr2-801010"] == dict(runs["bert-6x384-lr2"], random_replace=True)
    assert runs["bert-6x384-lr2"]["random_replace"] is False  # model.py's BERT default is 80/10/10


def test_probes_queue_behind_each_other():
    from ladder_gpu import finish_times
    # runs end training at 10, 12 and 50 s; one probe of 5 s at a time: the second waits for the first's
    assert finish_times(0.0, {"a": 12.0, "b": 10.0, "c": 50.0}, 5.0) == {"b": 15.0, "a": 20.0, "c": 55.0}
    assert finish_times(30.0, {"a": 12.0}, 5.0) == {"a": 35.0}  # a run already ended is probed from now


def test_a_run_that_would_miss_the_deadline_is_stopped_and_only_it():
    from ladder_gpu import too_late
    # probes of 10 s, one at a time: a ends at 50 (probed by 60), b at 55 (by 70), c at 90 (by 100)
    ends = {"a": 50.0, "b": 55.0, "c": 90.0}
    assert too_late(0.0, ends, 10.0, 100.0) == {}
    assert too_late(0.0, ends, 10.0, 99.0) == {"c": 100.0}  # stopping c alone lets a and b finish
    assert too_late(0.0, ends, 10.0, 65.0) == {"c": 100.0, "b": 70.0}


def test_flat_scores_are_the_sweeps_format():
    from ladder_gpu import flat
    got = flat({"topic": {"linear": 60.0, "knn": 55.0}, "linear_avg": 60.0, "knn_avg": 55.0})
    assert got == {"topic/linear": 60.0, "topic/knn": 55.0, "linear_avg": 60.0, "knn_avg": 55.0}


def zipf_corpus(folder, n, seed):
    """A train.bin and val.bin of GPT-2 ids drawn from a Zipf law over 3,000 ids, so that a compact vocabulary of
    64 ids sends most ids (and many tokens) to <unk>."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for split, size in (("train", n), ("val", n // 10)):
        (rng.zipf(1.3, size) % 3000 * 7 % 50000).astype(np.uint16).tofile(os.path.join(folder, f"{split}.bin"))
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"tokenizer": "gpt2", "dtype": "uint16", "vocab_size": 50304}, f)


def test_a_pack_gives_the_model_the_same_corpus(tmp_path):
    zipf_corpus(tmp_path / "corpus", 200_000, 0)
    info = pack_corpus(tmp_path / "corpus", 64, tmp_path / "pack")
    unpack_corpus(tmp_path / "pack", tmp_path / "unpacked")
    (w0, map0, uni0), (w1, map1, uni1) = (load_splits(tmp_path / d, 16, 64) for d in ("corpus", "unpacked"))
    assert np.array_equal(map0, map1) and uni1 == uni0  # the same compact vocabulary and unigram baseline
    for split in ("train", "val"):
        a, b = np.asarray(w0[split].tokens), np.asarray(w1[split].tokens)
        assert np.array_equal(map0[a], map1[b])  # every token as the model reads it
        rare = map0[a] == 61  # <unk>: the only tokens whose GPT-2 id is not kept
        assert rare.mean() > 0.2 and np.array_equal(a[~rare], b[~rare]) and not np.array_equal(a[rare], b[rare])
    assert len(info["kept"]) == 61
    # a corpus changed after packing is refused in one line
    with open(tmp_path / "pack" / "corpus.json") as f:
        info = json.load(f)
    info["sha256"]["val"] = "0" * 64
    with open(tmp_path / "pack" / "corpus.json", "w") as f:
        json.dump(info, f)
    with pytest.raises(UserError, match="is not the packed corpus"):
        unpack_corpus(tmp_path / "pack", tmp_path / "again")


def test_packed_tasks_are_the_tasks_the_probes_read(tmp_path):
    folders = tiny_tasks(tmp_path).split(",")
    pack_tasks(",".join(folders), 15, tmp_path)  # 15 of each task's 40 training rows
    unpack_tasks(tmp_path, tmp_path / "unpacked")
    for folder in folders:
        full = load_task(folder, max_train=15)
        small = load_task(str(tmp_path / "unpacked" / os.path.basename(folder)), max_train=15)
        assert full["train"][0] == small["train"][0] and np.array_equal(full["train"][1], small["train"][1])
        assert full["dev"][0] == small["dev"][0] and full["classes"] == small["classes"]
        assert len(small["train"][0]) == 15 and len(small["dev"][0]) == 20


@pytest.mark.slow
def test_smoke_trains_probes_and_records_in_the_ladders_format(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "experiments/ladder_gpu.py", "--smoke", f"--tasks={tiny_tasks(tmp_path)}",
                           f"--out={out}", f"--work_dir={tmp_path / 'work'}", "--device=cpu", "--seeds=1",
                           "--lr_scales=1,2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(out)) == ["logs.txt", "report.json", "report.md", "results.jsonl"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    names = [r["name"] for r in records]
    assert "bert-1x64" in names and "random-bert-1x64" in names and "crossbert-1x64" in names
    md = (out / "report.md").read_text()
    assert "Smoke run" in md and "**bert-1x64**" in md and "ms a step" in md
    bert = next(r for r in records if r["name"] == "bert-1x64")
    cross = next(r for r in records if r["name"] == "crossbert-1x64")
    assert bert["axis"] == "main" and bert["cell"] == "bert-1x64" and bert["shape"] == "1x64" and bert["seed"] == 0
    assert abs(bert["flops"] - cross["flops"]) <= max(r["flops"] / r["steps"] for r in (bert, cross))
    for r in (bert, cross):  # every layer probed, the last one the run's score; five snapshots along training
        assert sorted(r["layers"]) == ["0", "1"] and r["scores"] == r["layers"]["1"]
        assert r["scores"]["linear_avg"] == pytest.approx((r["scores"]["topic/linear"] + r["scores"]["mood/linear"]) / 2)
        assert [p["step"] for p in r["trajectory"]] == [max(1, round(r["steps"] / 2 ** k)) for k in (5, 4, 3, 2, 1)]
        assert r["code"] and r["val_loss"] > 0
    assert "==> bert-1x64/train.log <==" in (out / "logs.txt").read_text()
    # BERT at twice the law's rate: an lr-axis record, beside the same twin, which is recorded once
    twice = next(r for r in records if r["name"] == "bert-1x64-lr2")
    assert (twice["axis"], twice["cell"], twice["lr_scale"], bert["lr_scale"]) == ("lr", "bert-1x64-lr2", 2.0, 1.0)
    assert twice["settings"] == dict(bert["settings"], learning_rate=2 * bert["settings"]["learning_rate"],
                                     min_lr=2 * bert["settings"]["min_lr"])
    assert names.count("random-bert-1x64") == 1


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    (["--sizes=4x256x2"], "--sizes=4x256x2: expected n_layer x n_embd pairs"),
    (["--sizes=2x100"], "--sizes=2x100: widths must be multiples of 64"),
    (["--families=bert,roberta"], "--families: unknown roberta"),
    (["--out="], "--out is needed"),
    (["--lr_scales=1,x2"], "--lr_scales=1,x2: expected comma-separated positive multipliers"),
    (["--lr_scales=0"], "--lr_scales=0: expected comma-separated positive multipliers"),
    ([], "--tasks is needed: the probes' task folders (train.tsv, dev.tsv) to pack, or a folder of them, e.g. "
         "--tasks=DIR/devtasks"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch, capsys):
    assert message in script_error(monkeypatch, capsys, "experiments/ladder_gpu.py", "--smoke", "--device=cpu",
                                   f"--out={tmp_path / 'out'}", f"--work_dir={tmp_path / 'work'}", *args)
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_no_pack_is_one_line(tmp_path, monkeypatch, capsys):
    assert "holds no pack; write one with python experiments/ladder_gpu.py --make_pack" in script_error(
        monkeypatch, capsys, "experiments/ladder_gpu.py", "--device=cpu", f"--out={tmp_path / 'out'}",
        f"--pack={tmp_path / 'nothing'}", f"--work_dir={tmp_path / 'work'}")
