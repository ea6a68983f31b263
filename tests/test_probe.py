import json
import math
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch

from evaluation import features
import probe
from plumbing.checkpoint import code_version
from conftest import assert_one_line_error, script_error
from data.tasks import load_task
from model import CrossBERT, ModelConfig

ROOT = probe.__file__.rsplit("/", 1)[0]
TINY = ["--ckpt=random", "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4"]


# ---------------------------------------------------------------- probes

@pytest.mark.parametrize("n,d", [(40, 5), (6, 10)])  # covariance path, then Gram path (fewer examples than features)
def test_ridge_matches_lstsq_of_augmented_system(n, d):
    rng = np.random.default_rng(0)
    X, Y, Xq = rng.normal(size=(n, d)) + 3, rng.normal(size=(n, 2)), rng.normal(size=(7, d))
    lams = [1e-3, 0.1, 10.0]
    for lam, pred in zip(lams, probe.ridge(X, Y, Xq, lams)):
        # [1 X; 0 sqrt(nλ) I] [b; W] = [Y; 0]: the intercept's column has no penalty row
        A = np.block([[np.ones((n, 1)), X], [np.zeros((d, 1)), math.sqrt(n * lam) * np.eye(d)]])
        sol = np.linalg.lstsq(A, np.vstack([Y, np.zeros((d, 2))]), rcond=None)[0]
        np.testing.assert_allclose(pred, sol[0] + Xq @ sol[1:], rtol=1e-8, atol=1e-10)


def test_knn_toy_labels_and_regression():
    X = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9], [-1, 0.05]])
    y = np.array([0, 0, 1, 1, 2])
    Xq = np.array([[2, 0.1], [0.05, 3], [-5, 0]])
    k1, k3 = probe.knn(X, y, Xq, [1, 3], n_classes=3)
    assert k1.tolist() == [0, 1, 2] and k3.tolist() == [0, 1, 2]  # the two nearest outvote the third
    # regression, k=2: exp(sim / TAU)-weighted mean of the two nearest targets
    t = np.array([0.0, 1.0, 5.0, 7.0, 9.0])
    q = np.array([[1.0, 0.5]])
    sims = X[:2] @ q[0] / np.linalg.norm(X[:2], axis=1) / np.linalg.norm(q[0])
    w = np.exp(sims / probe.TAU)
    (pred,) = probe.knn(X, t, q, [2])
    assert pred[0] == pytest.approx((w * t[:2]).sum() / w.sum(), rel=1e-5)


def test_probe_separates_a_separable_task():
    rng = np.random.default_rng(1)
    F = rng.normal(size=(300, 8)).astype(np.float32)
    y = (F[:, 0] > 0).astype(int)
    out = probe.probe(F[:200], y[:200], F[200:], y[200:], ("0", "1"), ("acc",))
    assert out["linear"]["score"] >= 95 and out["knn"]["score"] >= 80
    assert out["linear"]["lam"] in probe.LAMBDAS and out["knn"]["k"] in probe.KS and out["dim"] == 8


# ---------------------------------------------------------------- metrics

def test_score_averages_task_metrics_in_percent():
    s, values = probe.score(np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 0, 1]), ("f1", "acc"))
    assert values == pytest.approx({"f1": 80.0, "acc": 80.0}) and s == pytest.approx(80.0)


# ---------------------------------------------------------------- data

def write(path, rows, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join("\t".join(map(str, r)) for r in rows) + "\n", encoding="utf-8")


def tiny_glue(root, n_train=24, n_dev=8):
    """A GLUE-format folder with the quirks of the official files: headerless CoLA, MRPC's BOM, STS-B's 10 columns."""
    good, bad = ["great fun", "a lovely film", "wonderful acting"], ["dull and slow", "a boring mess", "awful plot"]
    def sents(i):
        return (good if i % 2 else bad)[i % 3] + f" number {i}", i % 2
    for split, n in (("train", n_train), ("dev", n_dev)):
        ex = [sents(i) for i in range(n)]
        write(root / "SST-2" / f"{split}.tsv", [("sentence", "label")] + ex)
        write(root / "CoLA" / f"{split}.tsv", [("gj04", y, "", s) for s, y in ex])
        write(root / "MRPC" / f"{split}.tsv", [("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")]
              + [(y, i, i + 1, s, '"quoted ' + s) for i, (s, y) in enumerate(ex)], bom=True)
        write(root / "STS-B" / f"{split}.tsv", [("index", "genre", "filename", "year", "old_index", "source1", "source2",
                                                 "sentence1", "sentence2", "score")]
              + [(i, "g", "f", "y", i, "none", "none", s, s[::-1], f"{(i % 6) * 0.8:.3f}") for i, (s, y) in enumerate(ex)])
        for task, labels in (("RTE", ("entailment", "not_entailment")), ("WNLI", (0, 1))):
            write(root / task / f"{split}.tsv", [("index", "sentence1", "sentence2", "label")]
                  + [(i, s, "it is " + s, labels[y]) for i, (s, y) in enumerate(ex)])
    return root


def test_readers_parse_the_official_layouts(tmp_path):
    glue = str(tiny_glue(tmp_path))
    cola = load_task("CoLA", glue)
    assert cola["train"][0][:2] == [("dull and slow number 0",), ("a lovely film number 1",)] and cola["train"][1][:2].tolist() == [0, 1]
    mrpc = load_task("MRPC", glue)
    assert mrpc["dev"][0][0] == ("dull and slow number 0", '"quoted dull and slow number 0')  # quotes are text
    assert load_task("STS-B", glue)["train"][1][:3].tolist() == [0.0, 0.8, 1.6]
    rte = load_task("rte", glue, max_train=10)
    assert rte["name"] == "RTE" and len(rte["train"][0]) == 10 and len(rte["dev"][1]) == 8
    assert rte["train"][1].tolist() == load_task("RTE", glue, max_train=10)["train"][1].tolist()


def test_user_task_folder(tmp_path):
    write(tmp_path / "mine" / "train.tsv", [("sentence", "label"), ("a", "cat"), ("b", "dog"), ("c", "eel")])
    write(tmp_path / "mine" / "dev.tsv", [("sentence", "label"), ("d", "dog")])
    t = load_task(str(tmp_path / "mine"))
    assert t["name"] == "mine" and t["classes"] == ["cat", "dog", "eel"] and t["metrics"] == ("acc", "macro_f1")
    assert t["dev"][1].tolist() == [1]
    write(tmp_path / "reg" / "train.tsv", [("sentence1", "sentence2", "label"), ("a", "b", "0.5"), ("c", "d", "2")])
    write(tmp_path / "reg" / "dev.tsv", [("sentence1", "sentence2", "label"), ("e", "f", "1.25")])
    t = load_task(str(tmp_path / "reg"))
    assert t["classes"] is None and t["metrics"] == ("pearson", "spearman") and t["train"][0][1] == ("c", "d")


def test_local_glue_row_counts(shared_dir):
    counts = {"SST-2": (67349, 872), "CoLA": (8551, 1043), "MRPC": (3668, 408), "STS-B": (5749, 1500),
              "RTE": (2490, 277), "WNLI": (635, 71)}
    for name, (n_train, n_dev) in counts.items():
        t = load_task(name, str(shared_dir / "glue"))
        assert (len(t["train"][0]), len(t["dev"][0])) == (n_train, n_dev), name
        assert len(t["train"][1]) == n_train and all(s.strip() for s in t["dev"][0][0])


# ---------------------------------------------------------------- bad input

def fails(args, *needles):
    assert_one_line_error(probe.main, args, "probe.py", *needles)


def test_bad_input_gives_clear_errors(tmp_path):
    glue = tiny_glue(tmp_path / "glue")
    fails(TINY + [f"--glue_dir={glue}", "--tasks=SST-2,MNLI"], str(glue / "MNLI"), "leave MNLI out of --tasks")
    fails(TINY + [f"--glue_dir={glue}", "--tasks=SST-3"], "unknown task 'SST-3'", "SST-2")
    with open(glue / "RTE" / "dev.tsv", "a") as f:
        f.write("9\tone field too few\tentailment\n")
    fails(TINY + [f"--glue_dir={glue}", "--tasks=RTE"], str(glue / "RTE" / "dev.tsv") + ":10", "3 tab-separated fields", "fix or delete")
    write(glue / "WNLI" / "dev.tsv", [("index", "sentence1", "sentence2", "label")])
    fails(TINY + [f"--glue_dir={glue}", "--tasks=WNLI"], str(glue / "WNLI" / "dev.tsv"), "no examples")
    write(glue / "SST-2" / "dev.tsv", [("sentence", "label"), ("fine", "2")])
    fails(TINY + [f"--glue_dir={glue}", "--tasks=SST-2"], "label '2' is not one of 0, 1")
    junk = tmp_path / "ckpt.pt"
    junk.write_text("not a checkpoint")
    fails([f"--ckpt={junk}", f"--glue_dir={glue}", "--tasks=CoLA"], str(junk), "not a checkpoint")
    fails([f"--ckpt={tmp_path / 'none.pt'}", f"--glue_dir={glue}", "--tasks=CoLA"], "none.pt")
    fails(TINY + [f"--glue_dir={glue}", "--tasks=CoLA", "--layers=3"], "--layers=3", "0..2")


def test_cli_error_is_one_line_without_traceback(tmp_path):
    r = subprocess.run([sys.executable, "probe.py", "--ckpt=random", f"--glue_dir={tmp_path}", "--tasks=QNLI"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"probe.py: error: no folder {tmp_path}/QNLI for GLUE task QNLI; "
                                             "put its train.tsv and dev.tsv there, or leave QNLI out of --tasks "
                                             "(train.py: --probe_tasks)"]


# ---------------------------------------------------------------- end to end

def test_end_to_end_random_model(tmp_path, capsys):
    glue = tiny_glue(tmp_path / "glue")
    write(tmp_path / "mine" / "train.tsv", [("sentence", "label")] + [(f"text {i}", "abc"[i % 3]) for i in range(12)])
    write(tmp_path / "mine" / "dev.tsv", [("sentence", "label")] + [(f"text {i}", "abc"[i % 3]) for i in range(6)])
    tasks = ["SST-2", "CoLA", "MRPC", "STS-B", "RTE", "WNLI", str(tmp_path / "mine")]
    probe.main([*TINY, f"--glue_dir={glue}", f"--tasks={','.join(tasks)}", "--layers=all",
                f"--out={tmp_path / 'p.json'}"])
    stdout = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in stdout.splitlines() if line.startswith("| ")]
    for layer in ("0", "1", "2"):
        names = [c[1].strip() for c in rows if c[0].strip() == layer]
        assert names == ["SST-2", "CoLA", "MRPC", "STS-B", "RTE", "WNLI", "mine", "**average**"]
    assert "STS-B: regression" in stdout
    out = json.loads((tmp_path / "p.json").read_text())
    assert out["layers"] == [0, 1, 2] and out["tasks"]["SST-2"]["n_train"] == 24 and out["tasks"]["mine"]["n_dev"] == 6
    sst = out["tasks"]["SST-2"]["layers"]["2"]
    assert sst["dim"] == 32 and 0 <= sst["linear"]["score"] <= 100 and sst["knn"]["k"] in probe.KS
    assert set(out["tasks"]["MRPC"]["layers"]["1"]["knn"]["metrics"]) == {"f1", "acc"}
    assert out["code"] == code_version()  # a random model's code is the code that built it


def test_checkpoint_and_train_monitor(tmp_path):
    glue = str(tiny_glue(tmp_path / "glue"))
    torch.manual_seed(0)
    model = CrossBERT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32))
    torch.save(dict(model=model.state_dict(), model_type="crossbert", model_args=asdict(model.config), step=7,
                    vocab_map=None),
               tmp_path / "ckpt.pt")
    probe.main([f"--ckpt={tmp_path / 'ckpt.pt'}", f"--glue_dir={glue}", "--tasks=SST-2", f"--out={tmp_path / 'p.json'}"])
    out = json.loads((tmp_path / "p.json").read_text())
    assert out["code"] is None  # a checkpoint from before the code was recorded; train.py's carry it (test_train)
    from_ckpt = out["tasks"]["SST-2"]["layers"]["2"]
    model.train()
    scores = probe.probe_tasks(model, "SST-2,STS-B", glue_dir=glue, max_train=20)
    assert model.training  # the monitor hands the model back in train mode
    assert set(scores) == {"SST-2/linear", "SST-2/knn", "STS-B/linear", "STS-B/knn"}
    again = probe.probe_tasks(model, ["SST-2"], glue_dir=glue, max_train=0)
    assert again["SST-2/linear"] == pytest.approx(from_ckpt["linear"]["score"])  # same weights, same scores


def test_random_twin_of_a_checkpoint_keeps_its_shape_and_vocabulary_map(tmp_path, monkeypatch, capsys):
    torch.manual_seed(123)
    model = CrossBERT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64))
    vocab_map = torch.randint(0, 64, (50304,))  # a compact vocabulary's map
    ckpt = tmp_path / "ckpt.pt"
    torch.save(dict(model=model.state_dict(), model_type="crossbert", model_args=asdict(model.config),
                    vocab_map=vocab_map), ckpt)
    settings = dict(features.MODEL_SETTINGS, ckpt="random", device="cpu")
    twins = [features.load_model(dict(settings, like=str(ckpt), seed=s))[0] for s in (0, 1)]
    for twin in twins:
        assert twin.config == model.config and torch.equal(twin.vocab_map, vocab_map)
        assert not torch.equal(twin.model.wte.weight, model.wte.weight)  # fresh weights
    assert not torch.equal(twins[0].model.wte.weight, twins[1].model.wte.weight)  # the seed picks them
    # without --like, a random model cannot know the checkpoint's map: it sees every GPT-2 id
    plain = features.load_model(dict(settings, n_layer=2, n_head=2, n_embd=32))[0]
    assert plain.vocab_map is None and plain.config.vocab_size == 50304
    glue = tiny_glue(tmp_path / "glue")
    assert "pass it with --ckpt=random" in script_error(monkeypatch, capsys, "probe.py", "--ckpt=out/none.pt",
                                                       f"--like={ckpt}", "--tasks=SST-2", f"--glue_dir={glue}")
