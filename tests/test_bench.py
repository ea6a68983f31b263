"""bench.py end to end on a tiny shape: the three models side by side, their ratios from flops.py."""
import json
import os
import subprocess
import sys

import pytest

from flops import flops_per_position
from model import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_reports_three_models():
    shape = dict(n_layer=1, n_head=2, n_embd=64, block_size=32)
    args = [f"--{k}={v}" for k, v in shape.items()] + ["--batch_size=2", "--steps=1", "--warmup=1", "--compile=False",
                                                       "--dtype=float32"]
    out = subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for model in ("bert", "crossbert", "electra"):
        assert result[f"{model}_input_tokens_per_s"] > 0 and 0 < result[f"{model}_mfu"]
    # CMS's two views: CrossBERT covers twice as many view positions as input tokens; the others one view each
    assert result["crossbert_view_positions_per_s"] == pytest.approx(2 * result["crossbert_input_tokens_per_s"], rel=1e-3)
    assert result["electra_view_positions_per_s"] == pytest.approx(result["electra_input_tokens_per_s"], rel=1e-3)
    cfg = {m: ModelConfig(model_type=m, **shape) for m in ("bert", "electra")}
    expected = flops_per_position(cfg["bert"], "bert") / flops_per_position(cfg["electra"], "electra")
    assert result["electra_flops_ratio"] == pytest.approx(expected, abs=1e-3)
    # every model's speedup is its view positions per second over BERT's
    assert result["crossbert_speedup"] == pytest.approx(
        result["crossbert_view_positions_per_s"] / result["bert_view_positions_per_s"], abs=2e-3)
