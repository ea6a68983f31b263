"""bench.py end to end on a tiny shape: the three models side by side, their ratios from flops.py; the peak and MFU;
bad input in one line."""
import itertools
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import script_error
from flops import flops_per_position
from model import ModelConfig

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

    import flops
    clock = iter([0.0, 0.9, 1.0, 1.4, 2.0, 2.7])  # three trials, each a start and an end: 0.9, 0.4 and 0.7 s
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    assert flops.peak_flops(torch.device("cpu"), torch.float32, trials=3) == pytest.approx(2 * 2048 ** 3 / 0.4)


def test_mfu_cannot_pass_100_percent():
    from flops import checked_peak

    def never():
        raise AssertionError("the peak is only measured again when a run beats it")
    assert checked_peak(5.0, 4.0, never) == 5.0                # below the peak: kept
    assert checked_peak(1.0, 4.0, lambda: 6.0) == 6.0          # beaten: measured again, on a quiet machine
    assert checked_peak(1.0, 4.0, lambda: 2.0) == 4.0          # still busy: at least what the run achieved


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    (["--dtype=float16"], "--dtype='float16': expected float32 or bfloat16"),
])
def test_bad_input_is_one_line(args, message, monkeypatch, capsys):
    assert message in script_error(monkeypatch, capsys, "bench.py", *args)
