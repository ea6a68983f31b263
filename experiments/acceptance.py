"""
The GPU acceptance run: one command that shows, on the first GPU it meets, that the GPU path works and what
it gives, in about 8 minutes on one H200, and writes experiments/results/gpu/<device>.md (and .json):

  1. bench.py at BERT-base shape (12 x 768, T = 512) for BERT, CrossBERT and ELECTRA: tokens/s, MFU, peak
     memory, and the flash check (a training step and encode() with only FlashAttention allowed);
  2. random-init twins of the pair below, probed frozen on the development tasks (this also times a probe);
  3. BERT vs CrossBERT at matched training FLOPs (train.py, one process) on the Gutenberg corpus with GPT-2's
     full vocabulary, the budget sized to the time left, batch and learning rate from sweep.py's gpu power laws;
  4. both checkpoints probed like their twins, and the time each part took.

    python experiments/acceptance.py --corpus=DIR/gutenberg --tasks=DIR/devtasks   # on a GPU
    python experiments/acceptance.py --smoke --tasks=DIR/devtasks   # tiny shapes on the CPU, a minute: the same path
    python experiments/acceptance.py --minutes=20 --corpus=path/to/texts --tasks=path/to/task_folders

Every part is written to the report as soon as it ends, and a part that fails is reported, not fatal, so a run
cut short still says what it measured.
"""
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from configurator import UserError, configure, make_config, user_errors
from plumbing.checks import at_least, check_device, check_writable
from evaluation.features import load_backbone
from flops import flops_per_position
from plumbing.throughput import fastest_dtype, peak_flops, time_steps
from model import MODELS
from report import Report
from runs import (PRESETS, ROOT, RunFailed, prepare_dataset, probe_model, read_log, run_settings, steps_for,
                  tokenized_tasks, train)

settings = dict(
    smoke=False,              # tiny shapes, the built-in corpus, CPU-sized budgets: checks the path, measures nothing
    minutes=8.0,              # the whole run's target wall time; the pair's FLOP budget is what is left of it ...
    pair_flops=0.0,           # ... unless this is > 0: the pair's training-FLOP budget, each
    n_layer=12, n_head=12, n_embd=768, block_size=512,  # bench's and the pair's shape
    batch_size=64,            # rows per bench step and per training micro-step
    bench_steps=10,           # timed bench steps per model, after 3 untimed ones
    eval_iters=10,            # the pair's validation batches
    dataset="gutenberg",      # a folder under data/ with train.bin and val.bin ...
    corpus="",                # ... prepared from this text (data/local/prepare.py) if it has none, e.g. DIR/gutenberg
    tasks="",                 # the probes' tasks (needed): a folder of task folders (train.tsv, dev.tsv), e.g.
                              # DIR/devtasks, or a comma-separated list of them
    max_train=10000,          # training examples per task for the probes (a seeded subset)
    random_seeds=2,           # random-init twins per model
    report="",                # "" = experiments/results/gpu/<device>.md
    work_dir="out-acceptance",  # the pair's checkpoints and logs
    device="cuda" if torch.cuda.is_available() else "cpu",  # cpu, cuda or cuda:N
    compile=True,             # torch.compile for bench and the pair
)
SMOKE = dict(minutes=2.0, pair_flops=1e11, n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=4, bench_steps=2,
             eval_iters=1, dataset="tinybooks", max_train=200, random_seeds=1, compile=False)


def part_bench(s, device, dtype, autocast, peak):
    b = dict(n_layer=s["n_layer"], n_head=s["n_head"], n_embd=s["n_embd"], block_size=s["block_size"],
             gen_width=0.25, batch_size=s["batch_size"], steps=s["bench_steps"], warmup=3, compile=s["compile"],
             flash_check=device.type == "cuda", profile=False, seed=0)
    rows, data = [], {}
    for m in MODELS:
        try:
            r = time_steps(m, b, device, autocast)
        except Exception as e:  # a model that cannot train here is the finding; the others still run
            rows.append(f"| {m} | failed: {type(e).__name__}: {' '.join(str(e).split())[:300]} |")
            continue
        data[m] = {k: v for k, v in r.items() if k != "config"}
        data[m]["mfu"] = r["flops_per_s"] / peak
        data[m]["flops_per_position"] = flops_per_position(r["config"], m)
        flash = {True: "served", None: "- (CPU)"}.get(r.get("flash"), f"failed: {r.get('flash')}")
        memory = f"{r['peak_memory'] / 2**30:.1f}" if r["peak_memory"] else "-"
        rows.append(f"| {m} | {r['input_tokens_per_s']:,.0f} | {r['view_positions_per_s']:,.0f} | "
                    f"{r['flops_per_s'] / 1e12:.3g} | {100 * data[m]['mfu']:.1f}% | {memory} | {r['warmup_s']:.0f} | "
                    f"{flash} |")
    ratio = ""
    if "bert" in data and "crossbert" in data:
        speed = data["crossbert"]["view_positions_per_s"] / data["bert"]["view_positions_per_s"]
        analytic = data["bert"]["flops_per_position"] / data["crossbert"]["flops_per_position"]
        ratio = (f"\n\nCrossBERT / BERT view positions per second: {speed:.2f}x, against the analytic FLOP ratio per "
                 f"view position of {analytic:.2f}x ({speed / analytic:.2f} of it).")
    md = (f"## 1. Training-step throughput (bench.py)\n\n{s['n_layer']} x {s['n_embd']}, T = {s['block_size']}, "
          f"{s['batch_size']} rows a step, GPT-2 vocabulary, {dtype}"
          f"{', compiled' if s['compile'] else ''}; MFU against {peak / 1e12:.3g} TFLOP/s. Input tokens are rows x T "
          "(unique data); view positions are rows x views x T (CrossBERT's two complementary views count twice). "
          "Warmup includes compilation.\n\n| model | input tokens/s | view positions/s | TFLOP/s | MFU | peak memory "
          "(GiB) | warmup (s) | flash check |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + ratio)
    return md, data


def pair_settings(s, flops):
    """train.py settings for one model of the pair: the sweep's gpu power laws (runs.py) for lr and batch, rows
    rounded to whole micro-batches of batch_size (so the compiled graphs have bench's shapes)."""
    p = dict(PRESETS["gpu"], dataset=s["dataset"], block_size=s["block_size"], nproc=1, micro_batch=s["batch_size"])
    out = {}
    for m in ("bert", "crossbert"):
        r = run_settings(p, s["n_layer"], s["n_embd"], s["n_head"], m, flops)
        rows = max(1, round(r["total_batch_size"] / s["block_size"] / s["batch_size"])) * s["batch_size"]
        r.update(total_batch_size=rows * s["block_size"], batch_size=s["batch_size"], compile=s["compile"])
        steps = steps_for(r)[0]
        r.update(warmup_iters=max(1, steps // 20), eval_interval=max(1, steps // 2), eval_iters=s["eval_iters"],
                 device=str(s["device"]))
        out[m] = r
    return out


def train_pair(s, budget):
    """{model: what its run did}: BERT and CrossBERT trained by train.py at `budget` training FLOPs each. A run
    that fails is reported ({"error": ...}), not fatal."""
    runs = {}
    for m, r in pair_settings(s, budget).items():
        run_dir = os.path.join(s["work_dir"], m)
        t0 = time.time()
        try:
            train(f"acceptance {m}", {**r, "overwrite": True}, run_dir, 1, s["compile"])
        except RunFailed as e:  # keep going to the report
            runs[m] = dict(error=str(e))
            continue
        log = read_log(run_dir)
        vals = [x for x in log if "val_loss" in x]
        steps = [x for x in log if "loss" in x]
        runs[m] = dict(settings=r, seconds=time.time() - t0, val_loss=vals[-1]["val_loss"], flops=vals[-1]["flops"],
                       tokens=vals[-1]["tokens"], unigram=log[0]["unigram_loss"], steps=steps[-1]["step"],
                       mfu=np.median([x["mfu"] for x in steps]) if steps else None,
                       ms_per_step=np.median([x["ms_per_step"] for x in steps]) if steps else None,
                       val_curve=[(x["step"], x["val_loss"]) for x in vals])
    return runs


def main(argv):
    s = configure(settings, argv, help_from=[__file__])
    if s["smoke"]:
        s.update({k: v for k, v in SMOKE.items() if f"--{k}" not in {a.split("=")[0] for a in argv}})
    check_device(s["device"])
    device = torch.device(s["device"])
    dtype = fastest_dtype(device.type)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report_path = s["report"] or os.path.join(ROOT, "experiments", "results", "gpu", name.replace(" ", "-") + ".md")
    at_least(s, 1, ("batch_size", "bench_steps", "eval_iters"))
    check_writable(report_path, "--report", folder=False)
    check_writable(s["work_dir"], "--work_dir")
    if not s["tasks"]:
        raise UserError("--tasks is needed: the probes' task folders (train.tsv, dev.tsv), or a folder of them, e.g. "
                        "--tasks=DIR/devtasks")
    t_start = time.time()
    deadline = t_start + 60 * s["minutes"]
    tasks = tokenized_tasks(s["tasks"], s["max_train"], s["block_size"])
    train_tokens = prepare_dataset(s["dataset"], s["corpus"])
    peak = peak_flops(device, getattr(torch, dtype))
    header = (f"# Acceptance run on {name}\n\n{time.strftime('%Y-%m-%d')}, torch {torch.__version__}"
              f"{f', CUDA {torch.version.cuda}' if device.type == 'cuda' else ''}, {dtype}; "
              f"`python experiments/acceptance.py {' '.join(argv)}` (target {s['minutes']:g} min)."
              + ("\n\n**Smoke run**: tiny shapes on the built-in corpus; it checks the path and measures nothing."
                 if s["smoke"] else ""))
    report = Report(report_path, header)
    report.add("setup (tasks tokenized, corpus checked)", time.time() - t_start, None)

    # 1. throughput, and the FLOP/s the pair's budget is sized with
    t0 = time.time()
    md, benched = part_bench(s, device, dtype, autocast, peak)
    report.add("bench", time.time() - t0, md, benched)

    # 2. random twins: the baseline, and how long one model's probes take
    t0 = time.time()
    probes, twins = {}, {}
    for m in ("bert", "crossbert"):
        for seed in range(s["random_seeds"]):
            torch.manual_seed(seed)
            cfg = make_config(dict(model_type=m, n_layer=s["n_layer"], n_embd=s["n_embd"], n_head=s["n_head"],
                                    block_size=s["block_size"], vocab_size=0))
            twins[f"{m} random s{seed}"] = probe_model(MODELS[m](cfg).to(device).eval(), tasks, s["batch_size"])
    probe_s = (time.time() - t0) / max(1, len(twins))
    report.add("random twins", time.time() - t0, probe_table(twins, tasks, s, "2. Random-init twins"), twins)

    # 3. the pair at matched FLOPs: what is left of the time, less two probes, split over two runs; each run
    # loses its warmup (compilation) to overhead and trains at 80% of bench's speed (evals, checkpoints)
    t0 = time.time()
    per_run = (deadline - t0 - 2 * probe_s - 10) / 2
    budget = s["pair_flops"] or min(((per_run - benched[m]["warmup_s"] - 15) * 0.8 * benched[m]["flops_per_s"]
                                     for m in ("bert", "crossbert") if m in benched), default=0)
    runs = train_pair(s, budget) if budget > 0 else {}
    md = pair_table(runs, budget, train_tokens, s) if budget > 0 else (
        f"## 3. BERT vs CrossBERT at matched FLOPs\n\nNot run: no time left for it ({per_run:.0f} s per run).")
    report.add("pair training", time.time() - t0, md, dict(budget=budget, runs=runs))

    # 4. the trained pair, probed like its twins
    t0 = time.time()
    for m, r in runs.items():
        if "error" not in r:
            backbone, _ = load_backbone(os.path.join(s["work_dir"], m, "ckpt.pt"), device)
            probes[f"{m} trained"] = probe_model(backbone, tasks, s["batch_size"])
            del backbone
    md = probe_table({**probes, **twins}, tasks, s, "4. Frozen probes: the trained pair against its random twins",
                     differences=True)
    report.add("trained probes", time.time() - t0, md, probes)
    print(f"acceptance: wrote {report_path}")


def probe_table(scores, tasks, s, title, differences=False):
    names = [t["name"] for t in tasks]
    lines = [f"## {title}\n\nLinear (ridge) / kNN probe scores (%) on mean-pooled last-layer features, "
             f"{len(names)} task(s), at most {s['max_train']:,} training examples each (seeded), probe.py's "
             "protocol.\n",
             "| model | linear avg | kNN avg | " + " | ".join(names) + " |", "|---" * (len(names) + 3) + "|"]
    for k, v in scores.items():
        lines.append(f"| {k} | {v['linear_avg']:.1f} | {v['knn_avg']:.1f} | "
                     + " | ".join(f"{v[n]['linear']:.1f} / {v[n]['knn']:.1f}" for n in names) + " |")
    if differences:
        for m in ("bert", "crossbert"):
            rand = [v for k, v in scores.items() if k.startswith(f"{m} random")]
            if f"{m} trained" in scores and rand:
                t = scores[f"{m} trained"]
                d = [f"{t[p] - np.mean([r[p] for r in rand]):+.1f} (random {min(r[p] for r in rand):.1f}-"
                     f"{max(r[p] for r in rand):.1f})" for p in ("linear_avg", "knn_avg")]
                lines.append(f"\n{m}: trained minus the mean of its {len(rand)} random twin(s): linear {d[0]}, "
                             f"kNN {d[1]}.")
    return "\n".join(lines)


def pair_table(runs, budget, train_tokens, s):
    lines = [f"## 3. BERT vs CrossBERT at matched FLOPs\n\nBudget {budget:.2e} training FLOPs each (flops.py's count), "
             f"{'as given' if s['pair_flops'] else 'sized to the time left'}. Corpus data/{s['dataset']}: "
             f"{train_tokens:,} training tokens, GPT-2 vocabulary "
             "(50,304). One process; batch and learning rate from sweep.py's gpu power laws, warmup 5%, cosine to "
             "lr/10. Input tokens are unique data; epochs = input tokens / corpus tokens.\n",
             "| model | steps | batch (tokens) | lr | FLOPs spent | input tokens (epochs) | val loss | unigram | "
             "ms/step | MFU | wall (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in runs.items():
        if "error" in r:
            lines.append(f"| {m} | failed: {r['error']} |")
            continue
        st = r["settings"]
        lines.append(f"| {m} | {r['steps']} | {st['total_batch_size']:,} | {st['learning_rate']:.2e} | "
                     f"{r['flops']:.3e} | {r['tokens']:,} ({r['tokens'] / train_tokens:.2f}) | {r['val_loss']:.3f} | "
                     f"{r['unigram']:.3f} | {r['ms_per_step']:.0f} | {100 * r['mfu']:.1f}% | {r['seconds']:.0f} |")
    curves = "; ".join(f"{m}: " + ", ".join(f"{v:.3f}@{k}" for k, v in r["val_curve"])
                       for m, r in runs.items() if "val_curve" in r)
    return "\n".join(lines) + (f"\n\nValidation loss by step: {curves}." if curves else "")


if __name__ == "__main__":
    with user_errors("acceptance.py"):
        main(sys.argv[1:])
