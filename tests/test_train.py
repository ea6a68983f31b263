"""train.py end to end, in subprocesses on a tiny model and a random-token corpus (its refusals in this process)."""
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from configurator import configure
from plumbing.checkpoint import code_version, load_checkpoint
from conftest import script_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=2", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=0", "--learning_rate=1e-3", "--min_lr=1e-3", "--compile=False"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    for split, n in [("train", 20_000), ("val", 4_000)]:
        rng.integers(0, 100, n, dtype=np.uint16).tofile(d / f"{split}.bin")  # 100 ids: easy to learn
    return str(d)


def train(out_dir, dataset, *args, nproc=1):
    launcher = [sys.executable, "train.py"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]
    cmd = launcher + TINY + [f"--dataset={dataset}", f"--out_dir={out_dir}", *args]
    result = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


# the shared runs (runs below): fp32, two micro-steps a step, a checkpoint every 2 steps
RUN = ["--eval_interval=2", "--total_batch_size=128", "--dtype=float32"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dataset):
    """A 4-step run ("full") and the same run 2 steps long ("cut"), trained once for every test that needs a run to
    compare with or a checkpoint to resume; a test that would write to one works on a copy of it (copy_run)."""
    d = tmp_path_factory.mktemp("runs")
    train(d / "full", dataset, "--max_iters=4", *RUN)
    train(d / "cut", dataset, "--max_iters=2", *RUN)
    return d


def copy_run(runs, name, tmp_path):
    return shutil.copytree(runs / name, tmp_path / name)


def losses(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


ELECTRA = ["--model_type=electra"]


@pytest.mark.parametrize("model", [[], ["--model_type=bert", "--random_replace=True"],
                                   pytest.param(ELECTRA, marks=pytest.mark.slow)], ids=["crossbert", "bert-80-10-10", "electra"])
def test_ddp_equals_gradient_accumulation(tmp_path, dataset, model):
    # 4 micro-batches of 2 x 32 tokens a step: four micro-steps in one process, or two in each of two (so DDP's
    # no-sync micro-step runs too); in fp32, where the order of a sum moves a weight by less than the tolerance
    args = ["--max_iters=4", "--eval_interval=4", "--total_batch_size=256", "--learning_rate=3e-3", "--min_lr=3e-3",
            "--dtype=float32", *model]
    train(tmp_path / "one", dataset, *args)
    train(tmp_path / "two", dataset, *args, nproc=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(one) == [1, 2, 3, 4]
    assert one[4] < one[1] - 0.1  # it trains
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=2e-4)
    a = load_checkpoint(tmp_path / "one" / "ckpt.pt")[0].state_dict()
    b = load_checkpoint(tmp_path / "two" / "ckpt.pt")[0].state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.parametrize("model", [[], pytest.param(ELECTRA, marks=pytest.mark.slow)], ids=["crossbert", "electra"])
def test_resume_continues_exactly(tmp_path, dataset, model):
    args = ["--eval_interval=3", "--total_batch_size=64", "--dropout=0.1", *model]
    train(tmp_path / "full", dataset, "--max_iters=6", *args)
    train(tmp_path / "cut", dataset, "--max_iters=3", *args)
    out = train(tmp_path / "cut", dataset, "--max_iters=6", "--init_from=resume", *args)
    assert "resumed from" in out.stdout
    full, cut = losses(tmp_path / "full"), losses(tmp_path / "cut")
    assert [cut[s] for s in (4, 5, 6)] == [full[s] for s in (4, 5, 6)]
    ckpt = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 6 and ckpt["tokens"] == 6 * 64 and ckpt["flops"] > 0


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_electra_logs_its_loss_parts(tmp_path, dataset):
    train(tmp_path, dataset, "--max_iters=4", "--eval_interval=4", "--total_batch_size=64", *ELECTRA)
    logged = records(tmp_path)
    step = next(r for r in logged if r.get("step") == 4 and "loss" in r)
    # the loss is the generator's MLM loss + 50 x the RTD loss (rounding: 4 decimals each)
    assert step["loss"] == pytest.approx(step["mlm_loss"] + 50 * step["rtd_loss"], abs=0.01)
    val = next(r for r in logged if r.get("step") == 4 and "val_loss" in r)
    assert 0 <= val["val_rtd_accuracy"] <= 1 and 0 < val["val_rtd_loss"]
    # only masked positions (15%, 5 of 32) can be replaced; a generator this young rarely samples the original
    assert 0.1 < val["val_replaced"] <= 5 / 32
    assert val["below_unigram"] == pytest.approx(logged[0]["unigram_loss"] - val["val_loss"], abs=2e-4)


def test_resume_rejects_another_model(tmp_path, dataset, runs, monkeypatch, capsys):
    args = ["train.py", *TINY, *RUN, f"--dataset={dataset}", f"--out_dir={copy_run(runs, 'cut', tmp_path)}",
            "--init_from=resume"]
    other = script_error(monkeypatch, capsys, *args, "--model_type=bert")
    assert "holds a crossbert model but model_type=bert" in other
    wider = script_error(monkeypatch, capsys, *args, "--n_embd=64")
    assert "different model config" in wider and "n_embd" in wider


def test_a_run_records_its_code(runs):
    # the code a result comes from: in the log's first record and in the checkpoint, as checkpoint.code_version() says
    first = records(runs / "full")[0]
    ckpt = torch.load(runs / "full" / "ckpt.pt", weights_only=True)
    assert first["step"] == 0 and "unigram_loss" in first
    assert first["code"] == ckpt["code"] == code_version()


def test_wandb_missing_is_one_line_before_anything_is_written(tmp_path, dataset, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # an import of wandb fails, as where it is not installed
    err = script_error(monkeypatch, capsys, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}",
                       "--wandb_log=True")
    assert "--wandb_log=True needs wandb, which is not installed: pip install wandb" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_compiled_checkpoint_loads_uncompiled(tmp_path, dataset):
    train(tmp_path, dataset, "--max_iters=2", "--eval_interval=2", "--total_batch_size=64", "--compile=True",
          "--model_type=bert")
    model, ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert ckpt["model_type"] == "bert" and model.config.n_embd == 32
    assert model.encode(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 32)


def test_cli_config_errors_are_clear(tmp_path, dataset, monkeypatch, capsys):
    bad = script_error(monkeypatch, capsys, "train.py", "--batchsize=8", f"--out_dir={tmp_path}")
    assert "unknown setting 'batchsize'" in bad and "batch_size" in bad
    odd = script_error(monkeypatch, capsys, "train.py", "--total_batch_size=100", f"--dataset={dataset}",
                       f"--out_dir={tmp_path}")
    assert "must be a multiple of" in odd and "are 128 and 256" in odd


def test_configure_types_and_files(tmp_path, capsys):
    defaults = {"lr": 1e-3, "steps": 10, "name": "x", "flag": True, "ratio": None}
    cfg_file = tmp_path / "c.py"
    cfg_file.write_text("steps = 20\nname = 'y'\n")
    cfg = configure(defaults, [str(cfg_file), "--lr=1", "--flag=False", "--ratio=0.3", "--name=z"])
    assert cfg == {"lr": 1.0, "steps": 20, "name": "z", "flag": False, "ratio": 0.3}
    assert configure(defaults, ["--flag"])["flag"] is True  # a bare --flag turns a boolean on
    # a text setting keeps what was typed, even when it reads as a number or a constant
    assert configure(defaults, ["--name=2.70e14"])["name"] == "2.70e14"
    assert configure(defaults, ["--name=None"])["name"] == "None"
    for argv, message in [(["--steps=1.5"], "steps must be a int"), (["--flag=1"], "flag must be a bool"),
                          (["--steps"], "expected --key=value"), (["nope.py"], "no such config file"),
                          (["--ratio=half"], "ratio must be a float")]:
        with pytest.raises(SystemExit) as e:
            configure(defaults, argv, types={"ratio": float})
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_non_finite_loss_stops_without_saving(tmp_path, dataset):
    cmd = [sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path}", "--max_iters=4",
           "--eval_interval=1", "--total_batch_size=64", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0.0"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "stopping without saving" in out.stderr and "learning_rate" in out.stderr and "init_std" in out.stderr
    if (tmp_path / "ckpt.pt").exists():  # whatever was saved before the blow-up is finite
        state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in state.values())


@pytest.mark.slow  # a whole run for plumbing: RUN_SLOW=1 (and CI) runs it
def test_flop_budget_sets_the_steps(tmp_path, dataset):
    from flops import training_flops
    from model import CrossBERT, ModelConfig
    cfg = CrossBERT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=8192)).config
    per_step = training_flops(cfg, "crossbert", 64 // 32)
    train(tmp_path, dataset, "--total_batch_size=64", "--eval_interval=100", f"--max_flops={3.5 * per_step}")
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 3 and ckpt["flops"] == 3 * per_step  # the most steps that fit in the budget


@pytest.mark.slow  # a whole run for plumbing: RUN_SLOW=1 (and CI) runs it
def test_unigram_baseline_is_logged_and_exact(tmp_path):
    import math
    from collections import Counter
    d = tmp_path / "data"
    d.mkdir()
    train_ids, val_ids = [1, 1, 1, 2, 2, 3] * 20, [1, 2, 3, 4, 4] * 20  # id 4 never occurs in train
    np.array(train_ids, np.uint16).tofile(d / "train.bin")
    np.array(val_ids, np.uint16).tofile(d / "val.bin")
    train(tmp_path / "out", str(d), "--total_batch_size=64", "--max_iters=1", "--vocab_size=0")
    logged = [json.loads(x) for x in open(tmp_path / "out" / "log.jsonl")]
    c, V = Counter(train_ids), 50304  # add-one smoothing over the model's 50,304 ids
    hand = -sum(math.log((c[t] + 1) / (len(train_ids) + V)) for t in val_ids) / len(val_ids)
    assert logged[0]["unigram_loss"] == pytest.approx(hand, abs=1e-4)
    assert logged[-1]["below_unigram"] == pytest.approx(hand - logged[-1]["val_loss"], abs=2e-4)


@pytest.mark.slow
def test_fsdp_equals_one_process_and_resumes(tmp_path, dataset):
    # two micro-steps per process: the first one without gradient sync
    args = ["--eval_interval=2", "--total_batch_size=256", "--learning_rate=3e-3", "--min_lr=3e-3", "--dtype=float32"]
    train(tmp_path / "one", dataset, "--max_iters=4", *args)
    train(tmp_path / "fsdp", dataset, "--max_iters=4", "--fsdp=True", *args, nproc=2)
    one, fsdp = losses(tmp_path / "one"), losses(tmp_path / "fsdp")
    assert all(fsdp[s] == pytest.approx(one[s], abs=2e-4) for s in one)
    a = load_checkpoint(tmp_path / "one" / "ckpt.pt")[0].state_dict()
    b = load_checkpoint(tmp_path / "fsdp" / "ckpt.pt")[0].state_dict()  # a full state dict, like any other run's
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # cut after 2 steps and resumed with FSDP: the same weights as the uninterrupted FSDP run
    train(tmp_path / "cut", dataset, "--max_iters=2", "--fsdp=True", *args, nproc=2)
    train(tmp_path / "cut", dataset, "--max_iters=4", "--fsdp=True", "--init_from=resume", *args, nproc=2)
    c = load_checkpoint(tmp_path / "cut" / "ckpt.pt")[0].state_dict()
    assert all(torch.equal(b[k], c[k]) for k in b)


def records(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_any_process_count_reproduces_one_process(tmp_path, dataset):
    # no batch settings: total_batch_size stays the default and each process derives its share of the rows
    TINY_NO_BATCH = [a for a in TINY if not a.startswith("--batch_size")]
    runs = {}
    for n in (1, 2, 4):
        cmd = [sys.executable, "train.py"] if n == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "train.py"]
        out = subprocess.run(cmd + TINY_NO_BATCH + [f"--dataset={dataset}", f"--out_dir={tmp_path / str(n)}",
                                                    "--max_iters=3", "--eval_interval=3", "--block_size=64"],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        runs[n] = records(tmp_path / str(n))
    for n in (2, 4):
        assert [r["loss"] for r in runs[n] if "loss" in r] == pytest.approx(
            [r["loss"] for r in runs[1] if "loss" in r], abs=1e-3)
        # MFU is achieved FLOP/s over the peak of every device: all processes' FLOPs / (per-device peak x N)
        head = runs[n][0]
        assert head["world_size"] == n and head["tokens_per_step"] == runs[1][0]["tokens_per_step"]
        for r in (r for r in runs[n] if "mfu" in r):
            achieved = head["flops_per_step"] / (r["ms_per_step"] / 1000)
            assert r["mfu"] == pytest.approx(achieved / (head["peak_flops_per_device"] * n), rel=0.01, abs=1e-4)
            assert r["view_positions_per_s"] == pytest.approx(2 * r["input_tokens_per_s"], rel=0.01)  # CMS: 2 views


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_a_peak_measured_on_a_busy_machine_is_measured_again(tmp_path, dataset):
    # the first measurement says 1 FLOP/s (the machine was busy at the start): the run beats it at its first log,
    # measures again, and no logged MFU passes 100%
    patch = ("import sys, runpy; import plumbing.throughput as flops; real = flops.peak_flops; calls = []\n"
             "def peak(*a): calls.append(1); return 1.0 if len(calls) == 1 else real(*a)\n"
             "flops.peak_flops = peak; sys.argv = ['train.py'] + sys.argv[1:]; runpy.run_path('train.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", patch, *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path}",
                          "--max_iters=3", "--eval_interval=3"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rs = records(tmp_path)
    assert rs[0]["peak_flops_per_device"] == 1.0
    again = [r for r in rs[1:] if "peak_flops_per_device" in r]
    assert len(again) == 1 and again[0]["step"] == 1 and again[0]["peak_flops_per_device"] > 1e6
    assert "beat the matmul peak measured at its start" in out.stdout + out.stderr
    assert all(0 < r["mfu"] <= 1 for r in rs if "mfu" in r)


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_resume_refuses_other_run_settings(tmp_path, dataset, runs, monkeypatch, capsys):
    out_dir = copy_run(runs, "cut", tmp_path)
    args = ["train.py", *TINY, *RUN, f"--dataset={dataset}", f"--out_dir={out_dir}", "--init_from=resume"]
    for arg, key in [("--seed=7", "seed"), ("--total_batch_size=64", "total_batch_size"),
                     ("--learning_rate=5e-3", "learning_rate")]:
        err = script_error(monkeypatch, capsys, *args, arg)
        assert "different settings" in err and key in err
    # a longer run, split into smaller micro-steps: allowed
    train(out_dir, dataset, *RUN, "--init_from=resume", "--max_iters=3", "--batch_size=1")


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_bf16_tracks_fp32(tmp_path, dataset, runs):
    train(tmp_path, dataset, "--max_iters=4", *RUN, "--dtype=bfloat16")  # the full run's settings, in bf16
    fp32, bf16 = losses(runs / "full"), losses(tmp_path)
    assert fp32[4] < fp32[1] - 0.05 and bf16[4] < bf16[1] - 0.05
    assert all(bf16[s] == pytest.approx(fp32[s], abs=0.03) for s in fp32)


def test_literal_default_settings_split_or_explain(tmp_path, monkeypatch, capsys):
    # 3072 tokens of 128 = 24 rows: they split over 1, 2, 3, 4, 6, 8 processes; over 5 the error names what would work
    for k, v in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="5", MASTER_ADDR="127.0.0.1", MASTER_PORT="0").items():
        monkeypatch.setenv(k, v)
    err = script_error(monkeypatch, capsys, "train.py", f"--out_dir={tmp_path}")  # every other setting the default
    assert "must be a multiple of block_size x processes" in err
    assert "the nearest values that work are 2560 and 3200" in err


def test_the_default_settings_take_a_step(tmp_path, dataset):
    # `python train.py` one step long, on the test corpus and uncompiled (the slow tests compile); every other setting
    # is the default: the model, the batch and its micro-steps, the optimizer, the dtype, the evaluation
    out = subprocess.run([sys.executable, "train.py", f"--dataset={dataset}", f"--out_dir={tmp_path}", "--max_iters=1",
                          "--compile=False"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 process(es) x 2 micro-step(s) x 12 rows x 128 tokens = 3072 tokens per step" in out.stdout
    model, ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["step"] == 1 and ckpt["model_type"] == "crossbert" and ckpt["config"]["vocab_size"] == 8192
    assert (model.config.n_layer, model.config.n_embd, model.config.block_size) == (2, 128, 128)
    assert [r["step"] for r in records(tmp_path) if "val_loss" in r] == [0, 1]
    trained = losses(tmp_path)
    assert list(trained) == [1] and math.isfinite(trained[1])


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_resume_on_another_device_type(tmp_path, dataset, runs):
    # a checkpoint from a GPU run carries CUDA generator states (16 bytes), which the CPU's generator refuses
    out_dir = copy_run(runs, "cut", tmp_path)
    ckpt = torch.load(out_dir / "ckpt.pt", weights_only=True)
    ckpt.update(rng=[torch.zeros(16, dtype=torch.uint8)], rng_device="cuda")
    torch.save(ckpt, out_dir / "ckpt.pt")
    out = train(out_dir, dataset, "--max_iters=4", "--init_from=resume", *RUN)
    assert "holds cuda RNG states" in out.stdout and "dropout is 0: nothing changes" in out.stdout
    full, cut = losses(runs / "full"), losses(out_dir)
    assert [cut[s] for s in (3, 4)] == [full[s] for s in (3, 4)]  # no dropout: the run is still exact


def test_validation_does_not_depend_on_the_micro_batch(tmp_path, dataset, runs):
    # batch_size only cuts a step into micro-steps: the validation data and losses stay the same (the full run's
    # steps are two micro-steps of 2 rows; here one of 4)
    train(tmp_path, dataset, "--max_iters=4", *RUN, "--batch_size=4")
    val = {run: [r["val_loss"] for r in records(run) if "val_loss" in r] for run in (runs / "full", tmp_path)}
    assert len(val[tmp_path]) == 3 and val[tmp_path] == pytest.approx(val[runs / "full"], abs=1e-4)


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_resume_with_another_length_says_so(tmp_path, dataset, runs):
    out_dir = copy_run(runs, "cut", tmp_path)
    out = train(out_dir, dataset, "--max_iters=4", "--init_from=resume", *RUN)
    assert "the run was 2 steps long and is now 4: the cosine schedule follows the new length from step 2" in out.stdout
    same = train(out_dir, dataset, "--max_iters=4", "--init_from=resume", *RUN)
    assert "cosine schedule" not in same.stdout


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_overwrite_removes_the_old_checkpoint_at_once(tmp_path, dataset, runs):
    # a run that replaces another and dies before its first save must not leave the old checkpoint beside its log
    out_dir = copy_run(runs, "cut", tmp_path)
    cmd = [sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={out_dir}", "--max_iters=4",
           "--eval_interval=100", "--total_batch_size=64", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0.0",
           "--overwrite=True"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "stopping without saving" in out.stderr
    assert "no checkpoint was written" in out.stderr and not (out_dir / "ckpt.pt").exists()


SLOW_PROBE = """
import datetime, runpy, sys, time
import torch.distributed as dist
import probe
import plumbing.throughput as flops
# a short timeout for the default group, and no peak measurement: the processes' own matmuls can end seconds apart on
# a busy machine, and the first collective after them would time out before any probe ran
init = dist.init_process_group
dist.init_process_group = lambda *a, **k: init(*a, **{**k, "timeout": datetime.timedelta(seconds=10)})
flops.peak_flops = lambda *args, **kwargs: 1e15
calls = []
def slow(*args, **kwargs):  # the first probe outlasts the default group's timeout
    time.sleep(15 if not calls else 0)
    calls.append(1)
    return {"SST-2/linear": 50.0}
probe.probe_tasks = slow
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_slow_probe_does_not_time_out_the_process_group(tmp_path, dataset):
    script = tmp_path / "slow_probe.py"
    script.write_text(SLOW_PROBE)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *TINY,
           f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}", "--max_iters=2", "--eval_interval=1",
           "--total_batch_size=128", "--probe_interval=1"]
    out = subprocess.run(cmd, cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    probed = [r["probe"] for r in records(tmp_path / "out") if "probe" in r]
    assert probed == [{"SST-2/linear": 50.0}] * 3  # steps 0 (15 s, the other process waiting), 1 and 2


def test_base_configs_share_one_file():
    # the three GPU base runs import config/base_dclm.py and set only what differs
    keys = dict(model_type="x", out_dir="x", gen_width=0.5, **{k: v for k, v in vars(__import__("config.base_dclm",
                fromlist=["*"])).items() if not k.startswith("_")})
    runs = {m: configure(keys, [os.path.join(ROOT, "config", f"base_{m}_dclm.py")]) for m in ("bert", "crossbert", "electra")}
    for m, cfg in runs.items():
        assert cfg["model_type"] == m and cfg["out_dir"] == f"out-base-{m}"
        assert cfg["n_embd"] == 768 and cfg["total_batch_size"] == 512 * 512 and cfg["vocab_size"] == 0
    differ = {k for k in keys if len({str(cfg[k]) for cfg in runs.values()}) > 1}
    assert differ == {"model_type", "out_dir", "gen_width"}  # ELECTRA also sets its generator's width


@pytest.mark.slow
def test_same_seed_same_losses_bit_for_bit(tmp_path, dataset):
    # two threads and torch.compile: the setting under which the embedding gradient's atomic adds varied run to run
    args = ["--max_iters=4", "--eval_interval=4", "--total_batch_size=256", "--compile=True", "--dtype=float32",
            "--learning_rate=3e-3", "--min_lr=3e-3"]
    for run in ("a", "b"):
        cmd = [sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path / run}", *args]
        out = subprocess.run(cmd, cwd=ROOT, env={**ENV, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr
    a = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # every weight, after 4 steps
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_a_cpu_run_is_the_plain_loop_bit_for_bit(runs, dataset):
    # what a CPU run computes, written out as the plainest loop: each window sliced from the token file and stacked,
    # the whole batch's draws cut per micro-step, AdamW. train.py's weights after 4 steps (two micro-steps each) equal
    # it bit for bit, so what speeds up the GPU path (CUDA graphs, one gather of the windows, fewer checkpoints, eval
    # on the uncompiled model) leaves a CPU run's numbers as they were
    from data.loader import load_splits
    from masking import draws_of_rows
    from model import MODELS, ModelConfig
    ckpt = torch.load(runs / "full" / "ckpt.pt", weights_only=False)
    s, T = ckpt["config"], ckpt["config"]["block_size"]
    assert s["learning_rate"] == s["min_lr"] and s["warmup_iters"] == 0 and not s["compile"]  # lr constant, eager
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # as the run (OMP_NUM_THREADS=1), and deterministic as train.py on a CPU
    torch.use_deterministic_algorithms(True)
    try:
        windows, vocab_map, _ = load_splits(dataset, T, s["vocab_size"])
        tokens = windows["train"].tokens
        torch.manual_seed(s["seed"])
        model = MODELS[s["model_type"]](ModelConfig(**ckpt["model_args"]))
        assert torch.equal(ckpt["vocab_map"], torch.from_numpy(vocab_map))  # the map the data was read through
        optimizer = model.configure_optimizers(s["weight_decay"], s["learning_rate"], (s["beta1"], s["beta2"]), "cpu")
        rows, micro = s["total_batch_size"] // T, s["batch_size"]
        for step in range(4):
            key = np.random.SeedSequence([s["seed"], False, step]).generate_state(2)
            starts = np.random.default_rng(key).integers(0, len(tokens) - T + 1, size=rows)
            draws = model.draw(rows, T, generator=torch.Generator().manual_seed(int(key[1])))
            for first in range(0, rows, micro):
                mine = slice(first, first + micro)
                idx = torch.from_numpy(vocab_map[np.stack([tokens[a:a + T] for a in starts[mine]]).astype(np.int64)])
                loss, _ = model(idx, *draws_of_rows(draws, mine, model.config.views[0]))
                (loss / (rows // micro)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), s["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    assert ckpt["step"] == 4 and rows // micro == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, ckpt["model"][k]), k


def test_a_seed_changes_the_data_and_the_init_and_nothing_else(tmp_path, dataset):
    from evaluation.features import Backbone, random_twin
    # a learning rate of 1e-12 leaves the weights where they started: the initial weights of each seed
    args = ["--max_iters=2", "--eval_interval=2", "--total_batch_size=64", "--learning_rate=1e-12", "--min_lr=1e-12",
            "--dtype=float32"]
    for seed in (1337, 1338):
        train(tmp_path / str(seed), dataset, *args, f"--seed={seed}")
    a, ca = load_checkpoint(tmp_path / "1337" / "ckpt.pt")
    b, cb = load_checkpoint(tmp_path / "1338" / "ckpt.pt")
    # sweep.py's random twin k is training seed k's init: trained minus twin is what training did to that init
    for model, seed in ((a, 1337), (b, 1338)):
        twin = random_twin(Backbone(model), seed).model.state_dict()
        assert all(torch.allclose(twin[k], v, atol=1e-9) for k, v in model.state_dict().items())
    assert not torch.equal(a.wte.weight, b.wte.weight)
    assert {k for k in ca["config"] if ca["config"][k] != cb["config"][k]} == {"seed", "out_dir"}
    la, lb = records(tmp_path / "1337"), records(tmp_path / "1338")
    assert [r["loss"] for r in la if "loss" in r] != [r["loss"] for r in lb if "loss" in r]  # other training data
    # validation batches are the same for every seed: an (all but) untrained model scores them alike
    va, vb = ([r["val_loss"] for r in x if "val_loss" in r] for x in (la, lb))
    assert va[0] == pytest.approx(vb[0], abs=0.05)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_cmd(rank, rendezvous, port):
    """torchrun for node `rank` of a two-node run as users type it, both nodes on this machine."""
    where = ([f"--master_addr=127.0.0.1", f"--master_port={port}"] if rendezvous == "static" else
             ["--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=test"])
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}",
            *where, "train.py"]


@pytest.mark.slow
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_nodes_equal_one_process_and_resume_on_one(tmp_path, dataset, rendezvous):
    args = ["--total_batch_size=256", "--learning_rate=3e-3", "--min_lr=3e-3",
            "--dtype=float32", "--eval_interval=3"]
    train(tmp_path / "one", dataset, *args, "--max_iters=6")
    port = free_port()
    nodes = [subprocess.Popen(node_cmd(r, rendezvous, port) + TINY + args + [f"--dataset={dataset}", "--max_iters=3",
                                                                             f"--out_dir={tmp_path / 'two'}"],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    outs = [n.communicate(timeout=300)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(outs)
    assert '"world_size": 2' in (tmp_path / "two" / "log.jsonl").read_text()
    train(tmp_path / "two", dataset, *args, "--max_iters=6", "--init_from=resume")  # the two nodes' run, on one
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(two) == [1, 2, 3, 4, 5, 6] and one[6] < one[1] - 0.1
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=2e-4)


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_a_node_that_cannot_reach_the_master_stops_in_one_line(tmp_path, dataset):
    # a second node's process, as torchrun starts it (or a scheduler does), with no master at that address
    env = {**ENV, "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path}",
                          "--join_timeout=3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and 3 <= time.monotonic() - start < 60
    line = out.stderr.strip()
    assert "\n" not in line and line.startswith("train.py: error: rank 1 cannot reach the master at 127.0.0.1:")
    assert "after 3s" in line and "--master_addr" in line


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_a_resumed_run_keeps_its_trajectory(tmp_path, dataset):
    """snapshots=4 keeps the weights at 1/8, 1/4 and 1/2 of the run, each with its val loss. A run killed once its
    second snapshot is written, then resumed, ends with the same snapshots as an uninterrupted run, bit for bit, and
    a val record at each snapshot step exactly once."""
    args = ["--max_iters=64", "--eval_interval=100", "--total_batch_size=64", "--snapshots=4"]
    train(tmp_path / "full", dataset, *args)
    cut = tmp_path / "cut"
    cmd = [sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={cut}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (cut / "snapshots" / "step000016.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()  # wherever it is: the checkpoint on disk is whole (atomic writes), at step 8 or later
    assert proc.wait() == -9  # killed mid-run, 48 steps before its end
    resumed = train(cut, dataset, *args, "--init_from=resume").stdout
    assert int(resumed.split("resumed from ")[1].split(" at step ")[1].split()[0]) in (8, 16)
    for run in ("full", "cut"):
        names = sorted(os.listdir(tmp_path / run / "snapshots"))
        assert names == ["step000008.pt", "step000016.pt", "step000032.pt"]
        vals = [r["step"] for r in map(json.loads, open(tmp_path / run / "log.jsonl")) if "val_loss" in r]
        assert vals == [0, 8, 16, 32, 64]
    for name in names:
        a = torch.load(tmp_path / "full" / "snapshots" / name, weights_only=True)
        b = torch.load(cut / "snapshots" / name, weights_only=True)
        assert a["step"] == b["step"] == int(name[4:10]) and a["val_loss"] == b["val_loss"]
        assert a["code"] == b["code"] == code_version()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# train.py, with every torch.save (a checkpoint's write) sending the process SIGUSR1 first: a signal during the save
SIGNAL_IN_SAVE = """
import os, runpy, signal, sys
import torch
save = torch.save
def signalled_save(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGUSR1)
    return save(*args, **kwargs)
torch.save = signalled_save
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def stop_at_random_step(cmd, stop_after, signal_to):
    """Run cmd, send SIGTERM (by signal_to(process)) once it has logged step stop_after, and wait: (exit status, its
    output, the step the signal came after and the step it stopped at, as its one stop line says)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {stop_after}/"):
            signal_to(proc)
            break
    lines += proc.stdout.readlines()
    proc.wait(timeout=300)
    stop = [line for line in lines if line.startswith("train.py: SIGTERM came after step ")]
    assert len(stop) == 1, "".join(lines)
    came, stopped = (int(stop[0].split(f"{word} step ")[1].split(";")[0].split()[0]) for word in ("after", "at"))
    assert stop[0].rstrip().endswith("continue with the same settings and --init_from=resume (exit status 75)")
    return proc.returncode, "".join(lines), came, stopped


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_resume_continues_exactly(tmp_path, dataset):
    # a checkpoint only when signalled (and at the end): the stop's save is the first, and a second signal hits it
    args = ["--eval_interval=1000", "--total_batch_size=64", "--dropout=0.1", "--max_iters=30"]
    train(tmp_path / "full", dataset, *args)
    script = tmp_path / "signal_in_save.py"
    script.write_text(SIGNAL_IN_SAVE)
    k = random.randrange(2, 20)
    cmd = [sys.executable, "-u", str(script), *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path / 'cut'}", *args]
    status, out, came, stopped = stop_at_random_step(cmd, k, lambda p: p.send_signal(signal.SIGTERM))
    # the step in flight is finished (none is, if the signal came between a step's end and the check)
    assert status == 75 and k <= came <= stopped <= came + 1, (k, out)
    ckpt = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)  # whole, though signalled mid-write
    assert ckpt["step"] == stopped and not (tmp_path / "cut" / "ckpt.pt.tmp").exists()
    train(tmp_path / "cut", dataset, *args, "--init_from=resume")
    full, cut = losses(tmp_path / "full"), losses(tmp_path / "cut")
    assert list(cut) == list(range(1, 31)) and cut == full  # dropout included
    a, b = (torch.load(tmp_path / run / "ckpt.pt", weights_only=True)["model"] for run in ("full", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit: every weight at the end


def worker_pids(proc):
    """The processes torchrun started."""
    return [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]


@pytest.mark.slow
def test_sigterm_stops_every_torchrun_process_at_one_log_point(tmp_path, dataset):
    # SIGTERM to each process (as a cluster signals every task): they agree at the next log point, 3 steps apart
    args = ["--eval_interval=1000", "--total_batch_size=256", "--learning_rate=3e-3", "--min_lr=3e-3", "--dtype=float32",
            "--log_interval=3", "--max_iters=36"]
    train(tmp_path / "one", dataset, *args)
    k = 3 * random.randrange(1, 8)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *TINY,
           f"--dataset={dataset}", f"--out_dir={tmp_path / 'two'}", *args]
    status, out, came, stopped = stop_at_random_step(
        cmd, k, lambda p: [os.kill(pid, signal.SIGTERM) for pid in worker_pids(p)])
    assert out.count("exitcode  : 75") == 2 and status == 1, out  # each process exits 75; torchrun reports them
    assert k <= came <= stopped <= came + 3 and stopped % 3 == 0, (k, out)
    assert torch.load(tmp_path / "two" / "ckpt.pt", weights_only=True)["step"] == stopped
    train(tmp_path / "two", dataset, *args, "--init_from=resume", nproc=2)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert list(two) == list(one) == list(range(3, 37, 3))
    assert all(two[s] == pytest.approx(one[s], abs=2e-4) for s in one)  # the DDP tolerance


# train.py with wandb's runs spied on: what each run was started with and sent, in the file $SPY (one JSON per line)
SPY_ON_WANDB = """
import json, os, runpy, sys
import wandb
init = wandb.init
def spied_init(**kwargs):
    run = init(**kwargs)
    log = run.log
    def spied_log(data, step=None):
        with open(os.environ["SPY"], "a") as f:
            f.write(json.dumps({"id": run.id, "step": step, "data": data}) + "\\n")
        log(data, step=step)
    run.log = spied_log
    with open(os.environ["SPY"], "a") as f:
        f.write(json.dumps({"id": run.id, "init": {k: v for k, v in kwargs.items() if k != "config"}}) + "\\n")
    return run
wandb.init = spied_init
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_wandb_gets_the_records_of_the_log_and_a_resumed_run_goes_on_in_its_run(tmp_path, dataset):
    pytest.importorskip("wandb")
    script, spy = tmp_path / "spy_on_wandb.py", tmp_path / "spy.jsonl"
    script.write_text(SPY_ON_WANDB)
    env = {**ENV, "PYTHONPATH": ROOT, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
           "SPY": str(spy)}
    cmd = [sys.executable, str(script), *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}",
           "--eval_interval=2", "--total_batch_size=64", "--wandb_log=True", "--wandb_project=tiny"]
    runs, logs = [], []
    for more in (["--max_iters=2"], ["--max_iters=4", "--init_from=resume"]):
        out = subprocess.run(cmd + more, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        spied = [json.loads(line) for line in spy.read_text().splitlines()]
        spy.unlink()
        runs.append((spied[0]["init"], {s["id"] for s in spied}, spied[1:]))
        logs.append(records(tmp_path / "out"))
    (init1, ids1, sent1), (init2, ids2, sent2) = runs
    assert init1 == dict(project="tiny", name=str(tmp_path / "out"), id=None, resume="allow")
    assert init2 == {**init1, "id": ids1.pop()} and ids2 == {init2["id"]}  # the resumed run goes on in the first's
    # the records of log.jsonl, in order, each at its step: the first run's, then the resumed run's after those it kept
    assert all(s["step"] == s["data"]["step"] for s in sent1 + sent2)
    assert [s["data"] for s in sent1] == logs[0]
    kept = [r for r in logs[0] if r["step"] < 2 or (r["step"] == 2 and "loss" in r)]
    assert logs[1] == kept + [s["data"] for s in sent2] and logs[1][-1]["step"] == 4
    assert len(list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))) == 2  # wandb wrote both, offline


def test_a_flop_budget_that_overrides_max_iters_says_so():
    from model import CrossBERT, ModelConfig
    from plumbing import run
    from plumbing.throughput import Peak
    model = CrossBERT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32))
    s = dict(model_type="crossbert", block_size=32, total_batch_size=64, device="cpu", dtype="float32",
             max_flops=1e12, max_iters=100)
    peak = Peak(torch.device("cpu"), torch.float32, 1)
    lines = run.describe(model, s, 1, 1, 2, 1e9, 1000, 6.0, peak).splitlines()
    assert lines[0] == "note: max_flops=1e+12 sets the run's length: 1000 steps, not the max_iters setting's 100"
    assert not run.describe(model, dict(s, max_flops=0.0), 1, 1, 2, 1e9, 100, 6.0, peak).startswith("note")
