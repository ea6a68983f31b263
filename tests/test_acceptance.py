"""acceptance.py --smoke: the GPU acceptance run's whole path on tiny shapes, on the CPU; bad input in one line."""
import json
import os
import subprocess
import sys

import pytest

from conftest import script_error, tiny_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_smoke_run_writes_the_report(tmp_path):
    report = tmp_path / "report" / "cpu.md"
    out = subprocess.run([sys.executable, "experiments/acceptance.py", "--smoke", f"--tasks={tiny_tasks(tmp_path)}",
                          f"--report={report}", f"--work_dir={tmp_path / 'work'}", "--device=cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    md, data = report.read_text(), json.loads(report.with_suffix(".json").read_text())
    assert "Smoke run" in md and "| crossbert trained |" in md and "| bert random s0 |" in md
    for m in ("bert", "crossbert", "electra"):  # the bench part: three models, measured
        assert data["bench"][m]["input_tokens_per_s"] > 0 and "flash" not in data["bench"][m]  # a GPU check
    pair = data["pair training"]
    assert pair["budget"] == 1e11
    spent = [pair["runs"][m]["flops"] for m in ("bert", "crossbert")]
    assert all(0 < f <= 1e11 for f in spent)
    # matched: each run takes the most whole steps that fit, so they differ by less than a CrossBERT step
    per_step = pair["runs"]["crossbert"]["flops"] / pair["runs"]["crossbert"]["steps"]
    assert abs(spent[0] - spent[1]) < per_step
    for name in ("bert trained", "crossbert trained", "bert random s0", "crossbert random s0"):
        scores = {**data["random twins"], **data["trained probes"]}[name]
        assert set(scores) == {"topic", "mood", "linear_avg", "knn_avg"}
        assert scores["linear_avg"] == pytest.approx((scores["topic"]["linear"] + scores["mood"]["linear"]) / 2)
    assert set(data["times"]) >= {"bench", "random twins", "pair training", "trained probes"}


@pytest.mark.parametrize("args,message", [
    (["--device=tpu"], "--device='tpu': expected cpu or cuda[:N]"),
    (["--tasks={w}/none"], "--tasks: "),
    (["--tasks="], "--tasks is needed: the probes' task folders (train.tsv, dev.tsv), or a folder of them, e.g. "
                   "--tasks=DIR/devtasks"),
    (["--tasks={tasks}", "--dataset=unprepared"], "--corpus is needed: data/unprepared is not prepared; pass the "
                                                  "corpus's files, e.g. --corpus=DIR/unprepared"),
])
def test_bad_input_is_one_line(args, message, tmp_path, monkeypatch, capsys):
    args = [a.replace("{w}", str(tmp_path)) for a in args]
    if "--tasks={tasks}" in args:  # tasks that read, for a check that follows them
        args[args.index("--tasks={tasks}")] = f"--tasks={tiny_tasks(tmp_path)}"
    report = tmp_path / "report" / "cpu.md"
    assert message in script_error(monkeypatch, capsys, "experiments/acceptance.py", "--smoke", "--device=cpu",
                                   f"--report={report}", f"--work_dir={tmp_path / 'work'}", *args)
    assert not report.parent.exists() and not (tmp_path / "work").exists()
