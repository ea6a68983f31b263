"""bench.py end to end on a tiny shape: the three models side by side, their ratios from flops.py, at any mask ratio
and CMS; the peak and MFU; bad input in one line. flops.py's LM head share and its design table (the paper's throughput
claim, counted) against torch's FLOP counter."""
import itertools
import json
import os
import re
import subprocess
import sys

import pytest

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import bench
from conftest import script_error
from flops import design, flops_per_position, head_share, training_flops
from model import MODELS, ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_bench_reports_three_models():
    shape = dict(n_layer=1, n_head=2, n_embd=64, block_size=32)
    args = [f"--{k}={v}" for k, v in shape.items()] + ["--batch_size=2", "--steps=1", "--warmup=1", "--compile=False",
                                                       "--dtype=float32", "--profile", "--vocab_size=256"]
    out = subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for model in ("bert", "crossbert", "electra"):
        assert result[f"{model}_input_tokens_per_s"] > 0 and 0 < result[f"{model}_mfu"] <= 1
    # --profile: a table of top ops per model, sorted by time, the matmuls among them
    tables = out.stdout.split("top ops by self time")[1:]
    assert len(tables) == 3
    for table in tables:
        rows = list(itertools.takewhile(bool, (re.match(r"(\S.*?) +(\d+) +([\d.]+) +([\d.]+)%$", line)
                                               for line in table.strip().splitlines()[1:])))
        ms = [float(r[3]) for r in rows]
        assert len(rows) == 12 and ms == sorted(ms, reverse=True) and {"aten::mm", "aten::addmm"} & {r[1] for r in rows}
    # CMS's two views: CrossBERT covers twice as many view positions as input tokens; the others one view each
    assert result["crossbert_view_positions_per_s"] == pytest.approx(2 * result["crossbert_input_tokens_per_s"], rel=1e-3)
    assert result["electra_view_positions_per_s"] == pytest.approx(result["electra_input_tokens_per_s"], rel=1e-3)
    cfg = {m: ModelConfig(model_type=m, vocab_size=256, **shape) for m in ("bert", "electra")}  # a compact vocabulary
    expected = flops_per_position(cfg["bert"], "bert") / flops_per_position(cfg["electra"], "electra")
    assert result["electra_flops_ratio"] == pytest.approx(expected, abs=1e-3)
    # every model's speedup is its view positions per second over BERT's
    assert result["crossbert_speedup"] == pytest.approx(
        result["crossbert_view_positions_per_s"] / result["bert_view_positions_per_s"], abs=2e-3)


def test_peak_is_the_fastest_of_its_trials(monkeypatch):
    import time

    import torch

    import plumbing.throughput as flops
    clock = iter([0.0, 0.9, 1.0, 1.4, 2.0, 2.7])  # three trials, each a start and an end: 0.9, 0.4 and 0.7 s
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    assert flops.peak_flops(torch.device("cpu"), torch.float32, trials=3) == pytest.approx(2 * 2048 ** 3 / 0.4)


def test_mfu_cannot_pass_100_percent():
    from plumbing.throughput import checked_peak

    def never():
        raise AssertionError("the peak is only measured again when a run beats it")
    assert checked_peak(5.0, 4.0, never) == 5.0                # below the peak: kept
    assert checked_peak(1.0, 4.0, lambda: 6.0) == 6.0          # beaten: measured again, on a quiet machine
    assert checked_peak(1.0, 4.0, lambda: 2.0) == 4.0          # still busy: at least what the run achieved


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    (["--dtype=float16"], "--dtype='float16': expected float32 or bfloat16"),
    (["--mask_ratio=0.667"], "block_size must be a multiple of 3"),  # CrossBERT's three views of 256 positions
])
def test_bad_input_is_one_line(args, message, monkeypatch, capsys):
    assert message in script_error(monkeypatch, capsys, "bench.py", *args)


def test_mask_ratio_and_cms_reach_every_model(monkeypatch, capsys):
    monkeypatch.setattr(bench, "peak_flops", lambda device, dtype: 1e12)  # no peak measured: this checks the views
    bench.main(["--n_layer=1", "--n_head=2", "--n_embd=64", "--block_size=32", "--vocab_size=256", "--batch_size=2",
                "--steps=1", "--warmup=0", "--compile=False", "--dtype=float32", "--mask_ratio=0.75", "--cms=False"])
    out = capsys.readouterr().out
    assert all(f"{m:9s} mask 0.75 cms=False" in out for m in MODELS)
    result = json.loads(out.strip().splitlines()[-1])
    # one view each: CrossBERT's view positions are its input tokens, and its FLOP ratio is its encoder on a quarter
    assert result["crossbert_view_positions_per_s"] == result["crossbert_input_tokens_per_s"]
    cfg = {m: ModelConfig(model_type=m, n_layer=1, n_head=2, n_embd=64, block_size=32, vocab_size=256, mask_ratio=0.75,
                          cms=False) for m in ("bert", "crossbert")}
    assert result["crossbert_flops_ratio"] == pytest.approx(
        flops_per_position(cfg["bert"], "bert") / flops_per_position(cfg["crossbert"], "crossbert"), abs=1e-3)


@pytest.mark.slow  # eleven models timed: seconds of plumbing
def test_design_times_flops_design_rows(monkeypatch, capsys):
    monkeypatch.setattr(bench, "peak_flops", lambda device, dtype: 1e12)
    shape = dict(n_layer=1, n_head=2, n_embd=64, block_size=32, vocab_size=256)
    bench.main([f"--{k}={v}" for k, v in shape.items()] + ["--batch_size=2", "--steps=1", "--warmup=0",
                                                            "--compile=False", "--dtype=float32", "--design"])
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["design"]
    counted_rows = design(ModelConfig(model_type="bert", **shape))
    assert [(r["model_type"], r["cms"], r["block_size"]) for r in rows] == [
        (c["config"].model_type, c["config"].cms, c["config"].block_size) for c in counted_rows]
    for row, c in zip(rows, counted_rows):  # the analytic columns are flops.design's, the measured ones its timings
        assert row["counted_input_tokens_vs_bert"] == round(c["input_tokens_vs_bert"], 3)
        V = c["config"].views[0]  # both columns are rounded to 3 places
        assert row["view_positions_vs_bert"] == pytest.approx(V * row["input_tokens_vs_bert"], abs=(V + 1) * 5e-4)
    assert rows[0]["input_tokens_vs_bert"] == 1.0 and rows[0]["mask_ratio"] == 0.2   # the reference: BERT at its 20%
    assert [r["block_size"] for r in rows if r["cms"] and r["mask_ratio"] == 0.6667] == [30]  # three views of 10


def test_design_takes_the_shape_alone(monkeypatch, capsys):
    assert "--design varies mask_ratio and cms itself" in script_error(monkeypatch, capsys, "bench.py", "--design",
                                                                      "--cms=False")


def counted(model, B):
    """torch's count of one training step's FLOPs (forward and backward) on B rows, attention as matmuls."""
    idx = torch.randint(0, 250, (B, model.config.block_size))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx)[0].backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("model_type,mask_ratio,cms", [("bert", 0.2, False), ("crossbert", 0.5, True),
                                                        ("crossbert", 0.75, True), ("crossbert", 0.75, False),
                                                        ("electra", 0.15, False)])
def test_head_share_is_the_lm_heads_part_of_a_counted_step(model_type, mask_ratio, cms):
    torch.manual_seed(0)
    cfg = ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=256,
                      mask_ratio=mask_ratio, cms=cms)
    model = MODELS[model_type](cfg)
    B, (V, _, M) = 2, cfg.views
    step = counted(model, B)
    # the LM head alone, forward and backward, on states at every view's targets: what the step spends there
    h = torch.randn(B * V, M, cfg.n_embd, requires_grad=True)
    idx, targets = torch.randint(0, 250, (B * V, cfg.block_size)), torch.randint(0, cfg.block_size, (B * V, M))
    with FlopCounterMode(display=False) as counter:
        model.lm_loss(h, idx, targets)[1].backward()
    assert counter.get_total_flops() / step == pytest.approx(head_share(cfg, model_type), rel=1e-12)


def test_design_counts_the_encoder_on_visible_tokens():
    torch.manual_seed(0)
    shape = dict(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=256)
    rows = {(r["config"].model_type, round(r["config"].mask_ratio, 3), r["config"].cms): r
            for r in design(ModelConfig(model_type="bert", **shape))}
    assert len(rows) == 10 and rows["bert", 0.2, False]["input_tokens_vs_bert"] == 1.0
    # against torch's counter: CrossBERT at 75% with one view, per input token, against flat BERT at 20%
    bert, cross = (counted(MODELS[m](ModelConfig(model_type=m, **shape, mask_ratio=r, cms=False)), 2) / 64
                   for m, r in (("bert", 0.2), ("crossbert", 0.75)))
    assert rows["crossbert", 0.75, False]["flops_per_token"] == cross
    assert rows["crossbert", 0.75, False]["input_tokens_vs_bert"] == pytest.approx(bert / cross, rel=1e-12)
    # a view costs the same with CMS or without; CMS makes V of them from each row
    for m, V in ((0.5, 2), (0.75, 4)):
        on, off = rows["crossbert", m, True], rows["crossbert", m, False]
        assert on["config"].views[0] == V and on["view_positions_vs_bert"] == off["view_positions_vs_bert"]
        assert on["input_tokens_vs_bert"] == pytest.approx(off["input_tokens_vs_bert"] / V, rel=1e-12)
    # three views need a block that 3 divides: counted at 30 positions, against BERT at 30
    third = rows["crossbert", 0.667, True]
    bert30 = ModelConfig(model_type="bert", **dict(shape, block_size=30))
    assert third["config"].block_size == 30 and third["config"].views == (3, 10, 20)
    bert_per_cross = training_flops(bert30, "bert") / training_flops(third["config"], "crossbert")
    assert third["input_tokens_vs_bert"] == bert_per_cross
