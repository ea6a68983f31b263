"""sweep.py: the plan, matched budgets, --dry_run, and resuming without retraining; runs.py's presets and power laws;
report.py's tables and plots; stats.py's intervals and trends; what a record says of the code behind it."""
import importlib.util
import json
import os
import shutil
import sys
import warnings

import numpy as np
import pytest
import torch

import report
import runs
import stats
import sweep
from plumbing.checkpoint import code_version, save_checkpoint
from conftest import script_error, tiny_tasks
from configurator import make_config, usage, user_errors
from data.tokenizer import VOCAB_SIZE, compact_vocab
from evaluation.features import random_twin
from flops import param_counts, training_flops
from model import MODELS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dry_run_trains_nothing(tmp_path, capsys):
    out = tmp_path / "sw"
    sweep.main(["--preset=cpu", "--dry_run", f"--out_dir={out}"])
    stdout = capsys.readouterr().out
    assert "bert-4x128" in stdout and "crossbert-4x128" in stdout and "minutes" in stdout
    assert not out.exists()


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_pairs_are_matched_on_flops(preset):
    p = runs.PRESETS[preset]
    planned = {name: s for name, axis, s in sweep.plan(p, ["main", "mask", "cms", "predictor"])}
    for name, s in planned.items():
        if name.startswith("bert-") and name.count("-") == 1:
            trio = [s, planned["cross" + name], planned["electra" + name.removeprefix("bert")]]
            spent = [runs.steps_for(x)[0] * runs.steps_for(x)[1] for x in trio]
            assert s["max_flops"] == trio[1]["max_flops"] == trio[2]["max_flops"] > 0
            assert (max(spent) - min(spent)) / max(spent) < 0.05  # whole steps: within 5% of each other
            assert max(spent) <= s["max_flops"]
    # CMS off sees the same unique tokens as its CMS-on twin: same steps and batch, half the FLOPs
    off = next(s for n, s in planned.items() if n.endswith("-nocms"))
    on = planned[next(n for n in planned if n.endswith("-nocms")).removesuffix("-nocms")]
    assert off["max_iters"] == runs.steps_for(on)[0] and off["total_batch_size"] == on["total_batch_size"]


@pytest.mark.parametrize("preset,nproc", [("gpu", 8), ("gpu", 1), ("cpu", 1)])
def test_every_run_has_a_micro_batch_that_fills_the_device(preset, nproc):
    p = dict(runs.PRESETS[preset], nproc=nproc)
    F0, _, batch0 = p["anchor"]
    for name, axis, s in sweep.plan(p, ["main", "mask", "cms", "predictor"]):
        rows = s["total_batch_size"] // s["block_size"] // nproc  # per process
        micro, accumulation = s["batch_size"], sweep.accumulation(s, nproc)
        assert s["total_batch_size"] == accumulation * micro * nproc * s["block_size"]  # equal micro-steps, no rest
        assert micro <= p["micro_batch"] and (micro >= 8 or micro == rows), (name, micro, rows)
        assert accumulation == -(-rows // p["micro_batch"])  # the fewest micro-steps that fit
        budget = s["max_flops"] or runs.steps_for(s)[0] * runs.steps_for(s)[1] * 2  # CMS off: half the main's
        wanted = batch0 * (budget / F0) ** runs.BATCH_EXP
        assert abs(s["total_batch_size"] - wanted) <= max(0.05 * wanted, nproc * s["block_size"] * accumulation)


def test_dry_run_prints_the_batch_split(capsys):
    sweep.main(["--preset=gpu", "--dry_run"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("bert-16x1024 "))
    assert "393216 tokens (8 x 2 x 48 rows)" in line  # 96 rows per GPU: two micro-steps of 48, not six of 16


def test_ladder_trains_every_size_at_20_tokens_per_parameter(capsys):
    planned = sweep.plan(runs.PRESETS["ladder"], ["main"], ("bert", "crossbert"))
    assert [n for n, _, _ in planned] == ["bert-2x128", "crossbert-2x128", "bert-3x192", "crossbert-3x192",
                                          "bert-4x256", "crossbert-4x256"]
    for name, _, s in planned:
        steps, per_step = runs.steps_for(s)
        bert = dict(s, model_type="bert")
        params = param_counts(make_config(bert), "bert")[0]  # embeddings included
        if name.startswith("bert"):  # 20 input tokens per parameter, to within a step
            assert abs(steps * s["total_batch_size"] - 20 * params) <= s["total_batch_size"]
        assert s["max_flops"] == 20 * params * training_flops(make_config(bert), "bert") / 128
        assert s["dataset"] == "web" and steps * per_step <= s["max_flops"]  # both families on the same budget
    sweep.main(["--preset=ladder", "--dry_run"])
    stdout = capsys.readouterr().out
    line = next(x for x in stdout.splitlines() if x.strip().startswith("bert-4x256 "))
    assert "(20.0 per parameter," in line and "5.29M params (3.19M without the embedding)" in line
    assert "electra" not in stdout  # the preset's families unless --families says otherwise


def test_plots_on_the_size_axis(tmp_path):
    pytest.importorskip("matplotlib")
    def run(fam, L, C, seed, axis):
        trained = axis == "main"
        return dict(name=f"{'' if trained else 'random-'}{fam}-{L}x{C}-s{seed}", axis=axis, seed=seed,
                    shape=f"{L}x{C}", model_type=fam, flops=C * 1e11 if trained else 0,
                    settings=dict(max_flops=C * 1e11, n_layer=L, n_embd=C, n_head=2, block_size=128, vocab_size=8192),
                    val_loss=6.0 - L / 10 if trained else None, unigram_loss=6.4 if trained else None,
                    scores=dict(linear_avg=55 + L + seed, knn_avg=45 + L), log=[dict(flops=C * 1e11, val_loss=6.0)])
    results = [run(f, L, C, k, a) for f in ("bert", "crossbert") for L, C in ((2, 128), (3, 192), (4, 256))
               for k in range(2) for a in ("main", "random")]
    written = report.plots(results, tmp_path)
    assert "probe_vs_params.png" in written and (tmp_path / "probe_vs_params.png").stat().st_size > 10_000
    assert report.rung_params(results[0]) == param_counts(
        make_config(dict(results[0]["settings"], model_type="bert")), "bert")[0]


def test_a_sweep_of_the_lr_axis_alone_draws_its_runs_val_loss_and_its_grid(tmp_path):
    pytest.importorskip("matplotlib")
    runs_ = [dict(name=f"bert-2x128-lr{m:g}", axis="lr", lr_scale=m, seed=0, shape="2x128", model_type="bert",
                  flops=1e14, settings=dict(max_flops=1e14, n_layer=2, n_embd=128, n_head=2, block_size=128,
                                            vocab_size=8192),
                  val_loss=4.2, unigram_loss=6.4, scores=dict(linear_avg=58.0, knn_avg=53.0),
                  log=[dict(flops=f, val_loss=6.0 - f / 1e14) for f in (2.5e13, 5e13, 1e14)]) for m in (0.5, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns when a legend has no lines to label
        written = report.plots(runs_, tmp_path)
    assert "val_loss_vs_flops.png" in written and (tmp_path / "val_loss_vs_flops.png").stat().st_size > 10_000
    assert "lr-2x128.png" in written and (tmp_path / "lr-2x128.png").stat().st_size > 10_000
    assert "probe_vs_flops.png" not in written and not (tmp_path / "probe_vs_flops.png").exists()  # no main runs


def test_budgets_select_a_subset_of_the_plan(monkeypatch, capsys):
    p = runs.PRESETS["cpu-gutenberg"]
    everything = sweep.plan(p, ["main"], seeds=3)
    some = sweep.plan(p, ["main"], ("crossbert",), seeds=3, budgets={"1.4e14", "5.4e14"})
    assert [n for n, _, _ in some] == [f"crossbert-4x256-{b}{s}" for b in ("1.4e14", "5.4e14") for s in ("", "-s1", "-s2")]
    assert all(s in [e for _, _, e in everything] for _, _, s in some)  # the same settings, only fewer runs
    err = script_error(monkeypatch, capsys, "experiments/sweep.py", "--preset=cpu-gutenberg", "--dry_run",
                       "--budgets=1.35e14,3e14")
    assert "3e14 not in preset cpu-gutenberg" in err and "its budgets are 3.4e13,6.8e13,1.4e14,2.7e14,5.4e14" in err
    sweep.main(["--preset=cpu-gutenberg", "--dry_run", "--budgets=2.7e14", "--families=bert", "--seeds=2"])
    assert [x.split()[0] for x in capsys.readouterr().out.splitlines() if x.startswith("  bert")] == \
        ["bert-4x256-2.7e14", "bert-4x256-2.7e14-s1"]


def test_the_lr_axis_scales_each_familys_law(monkeypatch, capsys):
    p = runs.PRESETS["ladder"]
    main = {n: s for n, _, s in sweep.plan(p, ["main"], ("bert", "crossbert"), seeds=2, budgets={"1.2e14"})}
    grid = sweep.plan(p, ["lr"], ("bert", "crossbert"), seeds=2, budgets={"1.2e14"}, lr_scales=(0.5, 2.0))
    assert [n for n, _, _ in grid] == ["bert-2x128-lr0.5", "bert-2x128-lr2", "crossbert-2x128-lr0.5",
                                       "crossbert-2x128-lr2", "bert-2x128-lr0.5-s1", "bert-2x128-lr2-s1",
                                       "crossbert-2x128-lr0.5-s1", "crossbert-2x128-lr2-s1"]
    for name, axis, s in grid:  # only the learning rate and its floor move: the budget, batch, seed and warmup stay
        law, m = main[name.replace("-lr0.5", "").replace("-lr2", "")], 0.5 if "lr0.5" in name else 2.0
        assert axis == "lr" and s["learning_rate"] == law["learning_rate"] * m and s["min_lr"] == law["min_lr"] * m
        assert {k: v for k, v in s.items() if k not in ("learning_rate", "min_lr")} == \
            {k: v for k, v in law.items() if k not in ("learning_rate", "min_lr")}
    err = script_error(monkeypatch, capsys, "experiments/sweep.py", "--preset=ladder", "--dry_run", "--axes=lr",
                       "--lr_scales=0.5,-2")
    assert "--lr_scales=0.5,-2: expected comma-separated positive multipliers" in err


def test_the_replace_axis_is_bert_80_10_10_at_each_rate():
    p = runs.PRESETS["ladder"]
    lr = {n: s for n, _, s in sweep.plan(p, ["lr"], ("bert", "crossbert"), seeds=2, budgets={"1.2e14"},
                                         lr_scales=(2.0,))}
    grid = sweep.plan(p, ["replace"], ("bert", "crossbert"), seeds=2, budgets={"1.2e14"}, lr_scales=(2.0,))
    assert [(n, a) for n, a, _ in grid] == [("bert-2x128-lr2-801010", "replace"), ("bert-2x128-lr2-801010-s1", "replace")]
    for name, _, s in grid:  # the all-<mask> run at the same rate, with 80/10/10 on
        assert s == dict(lr[name.replace("-801010", "")], random_replace=True)
    assert [n for n, _, _ in sweep.plan(p, ["replace"], ("bert",), budgets={"1.2e14"})] == ["bert-2x128-801010"]


def test_the_ladder_ablates_at_the_rungs_asked_for_seed_by_seed():
    p = runs.PRESETS["ladder"]
    planned = sweep.plan(p, ["cms", "predictor"], ("crossbert",), seeds=2, budgets={"1.2e14"})
    assert [(n, a) for n, a, _ in planned] == [
        ("crossbert-2x128", "main"), ("crossbert-2x128-pred2", "predictor"), ("crossbert-2x128-nocms", "cms"),
        ("crossbert-2x128-s1", "main"), ("crossbert-2x128-pred2-s1", "predictor"), ("crossbert-2x128-nocms-s1", "cms")]
    by = {n: s for n, _, s in planned}
    off, on = by["crossbert-2x128-nocms-s1"], by["crossbert-2x128-s1"]  # one view, the same steps and data
    assert off["seed"] == on["seed"] == 1338 and not off["cms"] and off["max_iters"] == sweep.steps_for(on)[0]
    assert by["crossbert-2x128-pred2"]["pred_layer"] == 2 and "pred_layer" not in on  # the main run's is 1
    assert [n for n, _, _ in sweep.plan(p, ["main"], ("crossbert",), budgets={"1.2e14"})] == ["crossbert-2x128"]


def test_the_mask_axis_runs_the_papers_ratios_at_blocks_their_views_divide():
    p = runs.PRESETS["ladder"]
    by = {n: s for n, a, s in sweep.plan(p, ["mask"], ("crossbert",), budgets={"1.2e14"}) if a == "mask"}
    assert sorted(by) == ["crossbert-2x128-mask0.667", "crossbert-2x128-mask0.75"]  # the families asked for only
    assert [n for n, a, _ in sweep.plan(p, ["mask", "cms"], ("bert",), budgets={"1.2e14"}) if a != "main"] == \
        ["bert-2x128-mask0.5"]
    main = sweep.plan(p, ["main"], ("crossbert",), budgets={"1.2e14"})[0][2]
    for name, views, block in (("crossbert-2x128-mask0.667", 3, 126), ("crossbert-2x128-mask0.75", 4, 128)):
        s = by[name]
        assert s["block_size"] == block and make_config(s).views[0] == views and s["max_flops"] == main["max_flops"]
        assert s["total_batch_size"] % (block * s["batch_size"]) == 0   # whole rows of the shorter block
        assert runs.steps_for(s)[0] * runs.steps_for(s)[1] <= s["max_flops"]


def test_power_laws_follow_the_budget():
    p = dict(runs.PRESETS["cpu"], anchor=(1e13, 1e-3, 4096))
    small, big = (runs.run_settings(p, 2, 64, 2, "bert", f) for f in (1e13, 1e15))
    assert small["learning_rate"] == pytest.approx(1e-3) and small["total_batch_size"] == 4096
    assert big["learning_rate"] == pytest.approx(1e-3 * 100 ** runs.LR_EXP)
    assert big["total_batch_size"] == pytest.approx(4096 * 100 ** runs.BATCH_EXP, rel=0.05)
    assert big["total_batch_size"] % p["block_size"] == 0


CODE = {"commit": "0" * 40, "dirty": False}


def fake_train(name, s, run_dir, nproc, compile):
    """What train.py leaves in run_dir, without training: a checkpoint (a compact vocabulary's map in it) and its
    log."""
    model = MODELS[s["model_type"]](make_config(s))
    vocab_map = torch.from_numpy(compact_vocab(np.ones(VOCAB_SIZE), s["vocab_size"])) if s["vocab_size"] else None
    os.makedirs(run_dir)
    save_checkpoint(os.path.join(run_dir, "ckpt.pt"), dict(model=model.state_dict(), model_type=s["model_type"],
                    model_args=vars(model.config), vocab_map=vocab_map, config=dict(s, dtype="bfloat16"), step=3,
                    tokens=384, flops=1e9, code=CODE))
    with open(os.path.join(run_dir, "log.jsonl"), "w") as f:
        for x in dict(step=0, unigram_loss=4.8), dict(step=3, val_loss=4.5, tokens=384, flops=1e9):
            f.write(json.dumps(x) + "\n")


def fake_sweep(tmp_path, monkeypatch, *argv):
    """sweep.main on a one-layer preset with fake_train, without matplotlib; its records."""
    monkeypatch.setattr(sweep, "train", fake_train)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    monkeypatch.setitem(runs.PRESETS, "tiny", dict(runs.PRESETS["cpu"], block_size=32, vocab_size=128,
                                                   sizes=[(1, 32, 2)], flops=[2e9], anchor=(2e9, 1e-3, 128),
                                                   probe_max_train=0, ablation_size=None))
    out = tmp_path / "sw"
    sweep.main(["--preset=tiny", f"--out_dir={out}", "--glue_dir=", "--glue_tasks=", "--sts=",
                f"--tasks={tiny_tasks(tmp_path)}", "--random_seeds=1", "--device=cpu", *argv])
    return out, [json.loads(x) for x in open(out / "results.jsonl")]


def test_a_record_names_the_code_behind_it(tmp_path, monkeypatch, capsys):
    """A run's record carries its checkpoint's "code" (what trained it) and dtype, a twin's the code that made it; and
    without matplotlib the sweep still runs and records, and says that it skips the plots."""
    out, (run, twin) = fake_sweep(tmp_path, monkeypatch, "--axes=main", "--families=bert")
    assert (run["name"], twin["name"]) == ("bert-1x32", "random-bert-1x32")
    assert run["code"] == CODE and twin["code"] == code_version()
    assert run["dtype"] == "bfloat16" and "dtype" not in twin  # a twin is not trained
    assert "sweep: drawing the sweep's plots needs matplotlib, which is not installed: pip install matplotlib; " \
           "skipping them" in capsys.readouterr().err
    assert (out / "results.md").exists() and not list(out.glob("*.png"))
    rows = (out / "results.md").read_text().split("## Every run")[1]
    assert "| bert-1x32 | main | bfloat16 |" in rows and "| random-bert-1x32 | random | - |" in rows
    older = [{k: v for k, v in r.items() if k != "code"} for r in (run, twin)]  # rows written before records had it
    assert report.summarize(older) == report.summarize([run, twin])


def test_only_the_lr_axis_records_a_multiple_of_the_law(tmp_path, monkeypatch):
    # CMS off trains by steps (no FLOP budget), so its learning rate has no law of its own to be a multiple of
    _, rs = fake_sweep(tmp_path, monkeypatch, "--axes=cms,lr", "--families=crossbert", "--lr_scales=2")
    by = {r["name"]: r for r in rs}
    assert sorted(by) == ["crossbert-1x32", "crossbert-1x32-lr2", "crossbert-1x32-nocms", "random-crossbert-1x32"]
    assert by["crossbert-1x32-lr2"]["lr_scale"] == 2 and by["crossbert-1x32-nocms"]["settings"]["max_flops"] == 0
    assert not any("lr_scale" in r for n, r in by.items() if n != "crossbert-1x32-lr2")


def test_plots_without_matplotlib_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit) as e, user_errors("sweep.py"):
        report.plots([], tmp_path)
    assert e.value.code == 2 and capsys.readouterr().err == (
        "sweep.py: error: drawing the sweep's plots needs matplotlib, which is not installed: pip install matplotlib\n")
    assert not list(tmp_path.iterdir())


def test_a_bad_device_is_one_line(monkeypatch, capsys):
    err = script_error(monkeypatch, capsys, "experiments/sweep.py", "--preset=cpu", "--dry_run", "--device=tpu")
    assert "--device='tpu': expected cpu or cuda[:N]" in err


@pytest.mark.parametrize("args,message", [
    ([], "--tasks is needed: the task folders (train.tsv, dev.tsv) the primary average is taken over, or a folder of "
         "them, e.g. --tasks=DIR/devtasks"),
    (["--tasks=a"], "--glue_dir is needed for --glue_tasks: pass GLUE's task folders, e.g. --glue_dir=DIR/glue, or "
                    "--glue_dir=hub to load GLUE from the hub, or --glue_tasks= to skip GLUE"),
])
def test_the_tasks_are_required_settings(args, message, tmp_path, monkeypatch, capsys):
    err = script_error(monkeypatch, capsys, "experiments/sweep.py", "--preset=cpu", f"--out_dir={tmp_path / 'sw'}",
                       *args)
    assert message in err and not (tmp_path / "sw").exists()


def test_no_path_outside_the_repository_in_the_help():
    """The task folders and corpora are settings to pass (DIR/... in the examples), not paths beside the checkout."""
    import acceptance
    import ladder_gpu
    import noise
    for script in (sweep, noise, acceptance, ladder_gpu):
        text = usage(script.settings, [script.__file__])
        assert "../" not in text and "DIR/devtasks" in text, script.__name__


@pytest.mark.slow
def test_sweep_runs_probes_and_resumes(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in [("train", 20_000), ("val", 4_000)]:
        rng.integers(0, 100, n, dtype=np.uint16).tofile(data / f"{split}.bin")
    task = tmp_path / "task"
    task.mkdir()
    for split, n in [("train", 60), ("dev", 20)]:
        rows = ["sentence\tlabel"] + [f"{'good fine' if i % 2 else 'bad awful'} words {i}\t{i % 2}" for i in range(n)]
        (task / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    tiny = dict(runs.PRESETS["cpu"], dataset=str(data), block_size=32, vocab_size=128, sizes=[(1, 32, 2)],
                flops=[2e9], anchor=(2e9, 1e-3, 128), ablation_size=0, eval_interval=5, probe_max_train=0)
    monkeypatch.setitem(runs.PRESETS, "tiny", tiny)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "sw"
    argv = ["--preset=tiny", f"--out_dir={out}", "--axes=main", f"--tasks={task}", "--glue_dir=", "--glue_tasks=", "--sts=",
            "--compile=False", "--random_seeds=2", "--device=cpu", "--seeds=2", "--families=bert,crossbert"]
    devices, tables, load = [], [], runs.load_backbone

    def load_and_look(path, device):  # each run's checkpoint is loaded once, after it trained
        devices.append(device)
        if len(devices) == 2:  # the table follows every run: the first is in it before the second is probed
            tables.append((out / "results.md").read_text())
        return load(path, device)
    monkeypatch.setattr(runs, "load_backbone", load_and_look)  # runs.run_record loads a trained run's checkpoint
    drawn, plots = [], sweep.plots
    monkeypatch.setattr(sweep, "plots", lambda results, d: drawn.append(len(results)) or plots(results, d))
    sweep.main(argv)
    plotted = importlib.util.find_spec("matplotlib") is not None  # an optional extra: the plots need it
    assert drawn == (list(range(1, 9)) if plotted else [])  # after every recorded run, and not once more at the end
    assert "| bert-1x32 |" in tables[0] and "crossbert-1x32" not in tables[0]
    assert devices == ["cpu"] * 4  # each checkpoint once, on the device the probes run on
    results = [json.loads(x) for x in open(out / "results.jsonl")]
    names = [r["name"] for r in results]
    # two training seeds per cell, seed by seed (every family at seed 0 first); the twins of a family and shape come
    # with its first run, twin k for seed k
    assert names == ["bert-1x32", "random-bert-1x32", "random-bert-1x32-s1", "crossbert-1x32", "random-crossbert-1x32",
                     "random-crossbert-1x32-s1", "bert-1x32-s1", "crossbert-1x32-s1"]
    assert [r["seed"] for r in results] == [0, 0, 1, 0, 0, 1, 1, 1] and results[6]["cell"] == "bert-1x32"
    assert results[6]["settings"]["seed"] == 1338 and results[0]["steps"] == results[6]["steps"]
    backbone, ckpt = load(out / "bert-1x32" / "ckpt.pt")
    assert results[0]["code"] == ckpt.get("code")  # the code that trained it, as its checkpoint says
    a, b = random_twin(backbone, 0), random_twin(backbone, 1)  # same shape and vocabulary map, new weights
    assert backbone.vocab_map is not None and torch.equal(a.vocab_map, backbone.vocab_map)
    assert not torch.equal(a.model.wte.weight, b.model.wte.weight)
    assert not torch.equal(a.model.wte.weight, backbone.model.wte.weight)
    bert, cross = results[0], results[3]
    for r in (bert, cross):
        assert r["flops"] <= 2e9 and abs(r["flops"] - bert["flops"]) / 2e9 < 0.25
    assert bert["steps"] > 0 and bert["unigram_loss"] > 0 and 0 <= bert["scores"]["linear_avg"] <= 100
    md = (out / "results.md").read_text()
    assert "| bert-1x32 |" in md.split("## Every run")[0] and "| crossbert − bert | 2 |" in md
    assert md.split("## Every run")[1].strip().count("\n") == 1 + len(results)
    if plotted:
        assert (out / "probe_vs_flops.png").stat().st_size > 10_000 and (out / "val_loss_vs_flops.png").exists()
    else:
        assert not list(out.glob("*.png"))

    def no_training(*args):
        raise AssertionError("a finished run was trained again")
    monkeypatch.setattr(sweep, "train", no_training)
    sweep.main(argv)  # everything is in results.jsonl: nothing trains, nothing is added
    assert [json.loads(x)["name"] for x in open(out / "results.jsonl")] == names
    assert drawn[8:] == ([8] if plotted else [])  # the plots of what is on record, drawn once


def test_summary_aggregates_seeds_and_pairs_them():
    # a synthetic results file: 3 seeds of BERT and CrossBERT at one budget, and 3 random twins per family
    def run(fam, seed, lin, knn, axis="main"):
        trained = axis == "main"
        return dict(name=f"{'' if trained else 'random-'}{fam}-4x256" + (f"-s{seed}" if seed else ""), axis=axis,
                    cell=f"{'' if trained else 'random-'}{fam}-4x256", seed=seed, shape="4x256", model_type=fam,
                    settings=dict(max_flops=1e14, n_layer=4, n_embd=256), flops=1e14 if trained else 0,
                    val_loss=5.0 + seed if trained else None, unigram_loss=6.2 if trained else None,
                    scores=dict(linear_avg=lin, knn_avg=knn))
    results = [run("bert", k, 60 + 2 * k, 50, "main") for k in range(3)]
    results += [run("bert", k, 58 + k, 51 + k, "random") for k in range(3)]
    results += [run("crossbert", k, 61 + 2 * k, 50 - k, "main") for k in range(3)]
    results += [run("crossbert", k, 60, 50, "random") for k in range(3)]
    results += [run("electra", k, 59 + 3 * k, 52, "main") for k in range(2)]  # two seeds only: pairs where both ran
    md = report.summarize(results)
    bert = next(line for line in md.splitlines() if line.startswith("| bert-4x256 |"))
    # trained 60, 62, 64 (mean 62, sd 2); twins 58, 59, 60 (59 ± 1); paired differences 2, 3, 4: mean 3, sd 1,
    # 95% half-width 4.303 / sqrt(3) = 2.48
    assert "| 3 | 6.000 ± 1.000 | 6.200 | 62.0 ± 2.0 | 59.0 ± 1.0 | +3.0 [+0.5, +5.5] |" in bert
    # kNN: trained 50, 50, 50 against 51, 52, 53: differences -1, -2, -3, whose interval holds 0
    assert "| -2.0 [-4.5, +0.5] |" in bert and bert.endswith("| above / not distinguishable |")
    # CrossBERT minus BERT, seed by seed: linear 1, 1, 1 (an interval of zero width); kNN 0, -1, -2
    cross = next(line for line in md.splitlines() if "crossbert − bert" in line)
    assert "| 3 | +1.0 [+1.0, +1.0] | -1.0 [-3.5, +1.5] | above / not distinguishable |" in cross
    # CrossBERT minus ELECTRA over the seeds both have: linear 61 - 59 = 2 and 63 - 62 = 1 (mean 1.5, sd 0.707, 95%
    # half-width 12.706 x 0.5 = 6.35); kNN 50 - 52 = -2 and 49 - 52 = -3
    vs = next(line for line in md.splitlines() if "crossbert − electra" in line)
    assert "| 2 | +1.5 [-4.9, +7.9] | -2.5 [-8.9, +3.9] | not distinguishable / not distinguishable |" in vs
    assert "| electra − bert | 2 |" in md and "electra − crossbert" not in md
    assert "| comparison | probe | pairs |" not in md  # one budget: no trend across budgets


def test_family_differences_get_a_trend_across_budgets():
    # CrossBERT leads BERT by 2 points at 1e14 FLOPs and by 1 at 4e14 (two doublings), at both seeds: -0.5 a doubling
    def run(fam, seed, flops, lin):
        return dict(name=f"{fam}-{flops:.0e}-s{seed}", axis="main", cell=f"{fam}-{flops:.0e}", seed=seed,
                    shape="4x256", model_type=fam, settings=dict(max_flops=flops), flops=flops, val_loss=5.0,
                    unigram_loss=6.0, scores=dict(linear_avg=lin, knn_avg=50.0))
    results = [run("bert", k, f, 60.0 + k) for k in range(2) for f in (1e14, 4e14)]
    results += [run("crossbert", k, f, 60.0 + k + (2 if f == 1e14 else 1)) for k in range(2) for f in (1e14, 4e14)]
    md = report.summarize(results)
    assert "| crossbert − bert | linear | 4 | -0.50 [-0.50, -0.50] |" in md
    assert "| crossbert − bert | kNN | 4 | +0.00 [+0.00, +0.00] |" in md and "electra − bert | linear" not in md


def test_crossing_is_the_first_budget_above_the_twins_or_the_trend_extrapolated():
    # one family at 2^40, 2^41, 2^42 FLOPs, 2 seeds each, twins scoring 0, so trained − init is the score itself
    def run(budget, seed, lin, knn):
        return dict(name=f"bert-{budget}-s{seed}", axis="main", seed=seed, shape="4x256", model_type="bert",
                    settings=dict(max_flops=2.0 ** budget, n_layer=4, n_embd=256), flops=2.0 ** budget,
                    val_loss=5.0, unigram_loss=6.2, scores=dict(linear_avg=lin, knn_avg=knn))
    lin = {40: (-4.5, -3.5), 41: (-2.5, -1.5), 42: (-0.5, 0.5)}
    knn = {40: (-4, -4), 41: (-1, -1.2), 42: (2, 2.2)}
    results = [run(b, k, lin[b][k], knn[b][k]) for b in lin for k in range(2)]
    results += [dict(name=f"random-bert-4x256-s{k}", axis="random", seed=k, shape="4x256", model_type="bert",
                     settings={}, flops=0, scores=dict(linear_avg=0.0, knn_avg=0.0)) for k in range(2)]
    md = report.summarize(results)
    # linear: budget means -4, -2, 0, so 2 points per doubling and 0 at 2^42 = 4.4e12; residuals ±0.5 over 6 points
    # (4 df, t 2.78): slope half-width 2.78 sqrt(0.375 / 4) = 0.85; the crossing's log2 half-width
    # 2.78 sqrt(0.375 / 6 / 4 + 4 * 0.375 / 4 / 16) = 0.549, so 2^41.451 = 3.0e12 to 2^42.549 = 6.4e12
    assert "| bert | linear | not reached | +2.00 [+1.15, +2.85] | 4.4e+12 [3.0e+12, 6.4e+12] |" in md
    # kNN: 2^42's differences 2.0 and 2.2 (mean 2.1, sd 0.14, t 12.71: half-width 1.27) are above 0
    assert "| bert | kNN | 4.40e+12 (+2.1 [+0.8, +3.4]) |" in md and md.split("| bert | kNN |")[1].split("\n")[0].endswith("| - |")
    flat = [dict(r, scores=dict(linear_avg=-2.0 + 0.1 * r["seed"], knn_avg=-1.0)) if r["axis"] == "main" else r
            for r in results]
    md = report.summarize(flat)  # no rise: no crossing is extrapolated
    assert "| bert | linear | not reached | +0.00 [" in md and "no rise beyond its interval: not extrapolated" in md


def test_a_barely_rising_trend_extrapolates_without_overflow():
    # the line rises significantly but so slowly that it reaches 0 near 2^2500 FLOPs: shown as a power of two
    slope, hw, x0, x0_hw = stats.trend([(2.0 ** b, -100 + 0.04 * b + e) for b in (40, 41, 42) for e in (-1e-3, 1e-3)])
    assert slope == pytest.approx(0.04) and hw < 0.01 and x0 == pytest.approx(2500, rel=1e-6)
    results = [dict(name=f"bert-{b}-s{k}", axis="main", seed=k, shape="4x256", model_type="bert",
                    settings=dict(max_flops=2.0 ** b, n_layer=4, n_embd=256), flops=2.0 ** b, val_loss=5.0,
                    unigram_loss=6.2, scores=dict(linear_avg=-100 + 0.04 * b + (2 * k - 1) * 1e-3, knn_avg=-1.0))
               for b in (40, 41, 42) for k in range(2)]
    results += [dict(name=f"random-bert-4x256-s{k}", axis="random", seed=k, shape="4x256", model_type="bert",
                     settings={}, flops=0, scores=dict(linear_avg=0.0, knn_avg=0.0)) for k in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        md = report.summarize(results)
    assert "| bert | linear | not reached | +0.04 [+0.04, +0.04] | 2^2500 [2^" in md


def tiny_ladder(tmp_path, monkeypatch, **changes):
    """The ladder preset as "tiny": random tokens, block 32, a vocabulary of 128, one rung given by `changes`; run
    from the repository's root. Returns the probes' task folder."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in [("train", 20_000), ("val", 4_000)]:
        rng.integers(0, 100, n, dtype=np.uint16).tofile(data / f"{split}.bin")
    monkeypatch.setitem(runs.PRESETS, "tiny", dict(runs.PRESETS["ladder"], dataset=str(data), block_size=32,
                                                    vocab_size=128, eval_interval=1000, probe_max_train=0, **changes))
    monkeypatch.chdir(ROOT)
    return tiny_tasks(tmp_path)


@pytest.mark.slow
def test_ladder_probes_along_training_and_across_layers(tmp_path, monkeypatch):
    """A preset with snapshots keeps the weights at log-spaced points; each is probed at every layer with its val
    loss, and the run and its twin are probed at every layer, the last layer's scores being the run's scores."""
    tasks = tiny_ladder(tmp_path, monkeypatch, sizes=[(2, 32, 2)], flops=[4e9], anchor=(4e9, 1e-3, 128), snapshots=4)
    out = tmp_path / "sw"
    sweep.main(["--preset=tiny", f"--out_dir={out}", f"--tasks={tasks}", "--glue_dir=", "--glue_tasks=", "--sts=",
                "--compile=False", "--random_seeds=1", "--device=cpu", "--families=bert"])
    run, twin = [json.loads(x) for x in open(out / "results.jsonl")]
    steps = run["steps"]
    points = run["trajectory"]
    assert [p["step"] for p in points] == [round(steps / 8), round(steps / 4), round(steps / 2)]  # 1/8, 1/4, 1/2
    vals = {x["step"]: x["val_loss"] for x in run["log"]}
    for p in points:  # each point's val loss is the one logged at its step; FLOPs grow with the steps
        assert p["val_loss"] == pytest.approx(vals[p["step"]], abs=1e-4)
        assert p["flops"] == pytest.approx(run["flops"] * p["step"] / steps)
        assert sorted(p["layers"]) == ["0", "1", "2"] and 0 <= p["layers"]["1"]["knn_avg"] <= 100
    for r in (run, twin):  # every layer of the run and its twin; the last layer's scores are the record's
        assert sorted(r["layers"]) == ["0", "1", "2"]
        assert r["layers"]["2"]["linear_avg"] == r["scores"]["linear_avg"]
        assert r["layers"]["2"]["knn_avg"] == r["scores"]["knn_avg"]
    assert "trajectory" not in twin
    # the snapshots are checkpoints probe.py reads, each at its step
    snap = out / "bert-2x32" / "snapshots" / f"step{points[0]['step']:06d}.pt"
    assert sweep.load_backbone(snap, "cpu")[1]["step"] == points[0]["step"]


@pytest.mark.slow
def test_a_folder_seeded_with_records_makes_new_twins_from_the_runs_it_trains(tmp_path, monkeypatch, capsys):
    """Runs on record from another folder (results.jsonl copied in, no checkpoints) are skipped, and the twin a new
    seed needs is made from the run this call trains; one no run here can make is named, and nothing stops."""
    tasks = tiny_ladder(tmp_path, monkeypatch, sizes=[(1, 32, 2)], flops=[2e9], anchor=(2e9, 1e-3, 128), snapshots=0)
    argv = ["--preset=tiny", f"--tasks={tasks}", "--glue_dir=", "--glue_tasks=", "--sts=", "--compile=False",
            "--device=cpu", "--families=bert"]
    first, second, third = (tmp_path / d for d in ("a", "b", "c"))
    sweep.main([*argv, f"--out_dir={first}", "--seeds=1", "--random_seeds=1"])
    for folder in (second, third):
        folder.mkdir()
        shutil.copy(first / "results.jsonl", folder / "results.jsonl")
    sweep.main([*argv, f"--out_dir={second}", "--seeds=2", "--random_seeds=1"])
    names = [json.loads(x)["name"] for x in open(second / "results.jsonl")]
    assert names == ["bert-1x32", "random-bert-1x32", "bert-1x32-s1", "random-bert-1x32-s1"]
    assert not (second / "bert-1x32").exists()  # seed 0 was not trained again
    capsys.readouterr()
    sweep.main([*argv, f"--out_dir={third}", "--seeds=1", "--random_seeds=2"])  # a twin, and no run here to make it from
    assert "random-bert-1x32-s1 not made" in capsys.readouterr().err
    assert [json.loads(x)["name"] for x in open(third / "results.jsonl")] == names[:2]


def test_layer_and_trajectory_tables():
    """The across-layers table finds the best layer of the seed mean and pairs last − best, last − layer 0 and
    trained − twin by seed; the along-training table starts at the twins and ends at the run's own scores."""
    def scores(linear, knn):
        return {str(i): {"linear_avg": a, "knn_avg": b} for i, (a, b) in enumerate(zip(linear, knn))}
    trained = [dict(name=f"bert-2x8{'-s1' * k}", cell="bert-2x8", seed=k, shape="2x8", axis="main", model_type="bert",
                    flops=100.0, steps=40, tokens=4000, val_loss=5.0 - k / 10, scores={}, layers=scores(lin, knn),
                    trajectory=[dict(step=s, flops=100.0 * s / 40, tokens=100 * s, val_loss=6.0 - s / 100 - k / 10,
                                     layers=scores([x + s / 10 for x in lin], knn)) for s in (10, 20)])
               for k, lin, knn in ((0, [50, 60, 55], [40, 45, 50]), (1, [52, 62, 54], [42, 44, 52]))]
    twins = [dict(name=f"random-bert-2x8{'-s1' * k}", seed=k, shape="2x8", axis="random", model_type="bert",
                  layers=scores(lin, [30, 30, 30]), scores={}) for k, lin in ((0, [50, 51, 49]), (1, [49, 50, 50]))]
    results = trained + twins
    linear = next(x for x in report.layer_table(results).splitlines() if "| linear |" in x).split(" | ")
    # mean by layer 51 / 61 / 54.5: best is layer 1; last − best -5, -8; last − layer 0 +5, +2; twins -1, +1;
    # trained − twin at the last layer 55 − 49, 54 − 50
    assert linear[3:9] == ["51.0 / 61.0 / 54.5", "1", stats.fmt([-5, -8], True), stats.fmt([5, 2], True),
                           stats.fmt([-1, 1], True), stats.fmt([6, 4], True) + " |"]
    knn = next(x for x in report.layer_table(results).splitlines() if "| kNN |" in x).split(" | ")
    assert knn[4:6] == ["2", stats.fmt([0, 0], True)]  # the last layer is kNN's best
    rows = [x.split(" | ") for x in report.trajectory_table(results).splitlines()[2:]]
    assert [r[2] for r in rows] == ["0", "10", "20", "40"] and [r[3] for r in rows] == ["0", "0.25", "0.5", "1"]
    assert rows[0][6] == "- (init)" and rows[1][6] == stats.fmt([5.9, 5.8], places=3)
    assert rows[0][7] == stats.fmt([49, 50]) and rows[1][7] == stats.fmt([56, 55])  # last layer, + 1 point at step 10
    assert rows[2][9] == stats.fmt([62, 64])  # the best layer at step 20: layer 1, + 2 points
    assert rows[3][7] == stats.fmt([55, 54])
