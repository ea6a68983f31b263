"""ladder_gpu.py --smoke: the GPU ladder's whole path on tiny rungs, on the CPU; bad input in one line."""
import json
import os
import subprocess
import sys

import pytest

from conftest import script_error, tiny_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(tmp_path, *args):
    report = tmp_path / "report" / "ladder-cpu.md"
    out = subprocess.run([sys.executable, "experiments/ladder_gpu.py", "--smoke", f"--tasks={tiny_tasks(tmp_path)}",
                          f"--report={report}", f"--work_dir={tmp_path / 'work'}", "--device=cpu", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    return report.read_text(), json.loads(report.with_suffix(".json").read_text())


@pytest.mark.slow
def test_smoke_ladder_writes_each_rung(tmp_path):
    # the smoke's own deadline must not refuse rung 2: 3 minutes did, on a 2-core AVX2 CPU busy with the suite
    md, data = run(tmp_path)
    assert "Smoke run" in md and "## 1 x 32:" in md and "## 2 x 64:" in md and "CrossBERT − BERT at equal FLOPs" in md
    for rung in ("1x32", "2x64"):
        runs = data[rung]
        bert, cross = runs["bert"], runs["crossbert"]
        per_step = cross["flops"] / cross["steps"]
        assert 0 < bert["flops"] and abs(bert["flops"] - cross["flops"]) < max(per_step, bert["flops"] / bert["steps"])
        for r in (bert, cross):
            for which in ("trained", "twin"):
                s = r[which]
                assert s["linear_avg"] == pytest.approx((s["topic"]["linear"] + s["mood"]["linear"]) / 2)
    assert data["2x64"]["bert"]["params"] > data["1x32"]["bert"]["params"]
    for r in data["2x64"].values():  # every layer probed, trained and twin; the last layer is the run's score
        assert sorted(r["layers"]["trained"]) == sorted(r["layers"]["twin"]) == ["0", "1", "2"]
        assert r["layers"]["trained"]["2"]["linear_avg"] == r["trained"]["linear_avg"]
        steps = [p["step"] for p in r["trajectory"]]  # five snapshots, halvings back from the end
        assert steps == [max(1, round(r["steps"] / 2 ** k)) for k in (5, 4, 3, 2, 1)]
        assert all(p["flops"] < r["flops"] and p["val_loss"] > 0 and len(p["layers"]) == 3 for p in r["trajectory"])
        assert "code" in r  # its checkpoint's: the code that trained it


def test_estimate_scales_the_steps_not_the_fixed_costs():
    from ladder_gpu import estimate
    # each family: 100 s of wall time of which 20 s are its 2e12 FLOPs at 1e11 FLOP/s, then 30 s of probes
    run = dict(train_s=100.0, train_rate=1e11, probe_s=30.0, flops=2e12)
    runs = {"bert": run, "crossbert": dict(run, train_rate=5e10, train_s=120.0)}
    # 8x the FLOPs: the steps take 8x as long (160 s, 320 s), the fixed costs (110 s, 110 s) do not grow
    assert estimate(runs, 1.6e13) == pytest.approx(160 + 110 + 320 + 110)
    assert estimate(runs, 2e12) == pytest.approx(100 + 30 + 120 + 30)  # the same FLOPs: what the rung took


@pytest.mark.slow
def test_a_rung_that_cannot_fit_is_not_started(tmp_path):
    # two seconds for the whole ladder: the first rung runs (there is no rate to judge it by), the second is refused
    md, data = run(tmp_path, "--minutes=0.03")
    assert "1x32" in data and "2x64" not in data
    assert "## 2 x 64: not run" in md and "exceeds the" in md


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    (["--sizes=4x256x2"], "--sizes=4x256x2: expected n_layer x n_embd pairs"),
    (["--sizes=2x100"], "--sizes: 2x100 cannot split into heads of 32 or 64 channels"),
    (["--families=bert,roberta"], "--families: unknown roberta"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch, capsys):
    report = tmp_path / "report" / "ladder-cpu.md"
    assert message in script_error(monkeypatch, capsys, "experiments/ladder_gpu.py", "--smoke", "--device=cpu",
                                   f"--report={report}", f"--work_dir={tmp_path / 'work'}", *args)
    assert not report.parent.exists() and not (tmp_path / "work").exists()
