"""
The paper's comparison at your scale: BERT, CrossBERT and ELECTRA families trained at matched training
FLOPs, every final checkpoint probed frozen, next to random-init twins of the same shape.

    python experiments/sweep.py --preset=cpu --dry_run      # the plan: runs, FLOPs, estimated time; trains nothing
    python experiments/sweep.py --preset=cpu                # 2 CPU cores, under an hour; writes sweep-cpu/
    python experiments/sweep.py --preset=gpu --nproc=8      # one 8-GPU node over the paper's range (needs DCLM)
    python experiments/sweep.py --preset=cpu --tasks=path/a,path/b   # probe your own task folders

For each size, the BERT, CrossBERT and ELECTRA runs get the same FLOP budget (train.py's max_flops, counted
by flops.py): a tokens-per-parameter rule or the preset's explicit budgets. Batch size and learning rate
come from power laws in the budget. Every run writes its own out_dir under the sweep folder; a run
already in results.jsonl is skipped, and a run cut short resumes from its checkpoint, so rerunning the
same command continues the sweep. Outputs, in out_dir: results.jsonl (one record per run),
results.md (the table) and, with matplotlib installed, probe_vs_flops.png, val_loss_vs_flops.png and
cms_tokens.png.

Axes besides the main BERT-vs-CrossBERT comparison (the paper's ablations), at one size:
  mask      BERT at 20% and 50% masking, CrossBERT at 50% and 75%, all at the same FLOPs
  cms       CrossBERT with and without complementary masking at equal unique tokens (equal steps):
            the "2x sample efficiency" claim, as val loss against unique training tokens
  predictor CrossBERT's predictor depth, at the same FLOPs
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root: train.py, data/
sys.path.insert(0, ROOT)
from configurator import check_writable, configure, fail, user_errors
from flops import budget_steps, param_counts, training_flops
from checkpoint import load_checkpoint
from data.tasks import EvalError, load_task
from features import random_twin
from model import MODELS, make_config

# -----------------------------------------------------------------------------
# Presets. Power laws: lr = lr0 * (F / F0) ** LR_EXP and batch = batch0 * (F / F0) ** BATCH_EXP tokens, with
# DeepSeek LLM's fitted exponents (the paper fits such laws on its 50M-700M models and does not print them;
# our choice), anchored at (F0, lr0, batch0): the CPU recipe measured in the README, or the GPU base configs.
LR_EXP, BATCH_EXP = -0.125, 0.327
PRESETS = {
    "cpu": dict(
        dataset="tinybooks", block_size=128, vocab_size=8192, dtype="",   # "" = train.py's default dtype
        sizes=[(2, 64, 2), (4, 128, 4), (4, 192, 4)],                     # (n_layer, n_embd, n_head)
        flops=[4e12, 1.6e13, 6.4e13],          # explicit training-FLOP budgets, one per size (0 = tokens_per_param)
        tokens_per_param=20,
        anchor=(1.6e13, 2e-3, 2048),           # (F0, lr0, batch0 tokens)
        ablation_size=1,                       # index into sizes
        flops_per_s=1.5e11,                    # achieved training FLOP/s on 2 CPU cores (bf16), for the time estimate,
        step_s=0.05,                           # + a fixed cost per step (small models are overhead-bound on CPUs)
        overhead_s=75,                         # + per run: compilation, validation, probing
        micro_batch=16,                        # rows per micro-step, at most (train.py's default)
        probe_max_train=2000, eval_interval=100, nproc=1,
    ),
    "cpu-gutenberg": dict(  # the long CPU preset: one shape, doubling budgets, up to the crossing (see README)
        dataset="gutenberg", block_size=128, vocab_size=8192, dtype="",
        sizes=[(4, 256, 4)] * 5,
        flops=[3.4e13, 6.8e13, 1.35e14, 2.7e14, 5.4e14],
        tokens_per_param=20,
        anchor=(2.7e14, 1e-3, 4096),           # the 4 x 256 recipe that beat its random twins once (README)
        ablation_size=None,                    # no ablations: the budget axis is the point
        flops_per_s=3.0e11,                    # achieved on 2 cores with native bf16, 4 x 256 (about 460 ms a step)
        step_s=0.02,
        overhead_s=240,
        micro_batch=16,
        probe_max_train=2000, eval_interval=200, nproc=1,
        seeds=3,
    ),
    "gpu": dict(
        dataset="dclm", block_size=512, vocab_size=0, dtype="",
        sizes=[(8, 512, 8), (12, 768, 12), (16, 1024, 16), (24, 1280, 20), (24, 1600, 25)],   # ~50M to ~800M
        flops=[0, 0, 0, 0, 0],
        tokens_per_param=20,
        anchor=(2e18, 1e-3, 262144),           # config/base_*_dclm.py: BERT-base size, 2.6B tokens
        ablation_size=1,
        flops_per_s=8 * 989e12 * 0.35,         # 8 H100/H200 at 35% MFU
        step_s=0.0,
        overhead_s=300,
        # rows per micro-step per GPU, at most: 64 rows of the largest size took 65 (BERT), 97 (CrossBERT) and
        # 75 GiB (ELECTRA) at peak on one H200 (eager bf16, experiments/results/gpu/); on 80 GB GPUs pass --micro_batch=32
        micro_batch=64,
        probe_max_train=20000, eval_interval=1000, nproc=8,
    ),
}

settings = dict(
    preset="cpu",
    out_dir="",               # "" = sweep-<preset>
    dry_run=False,
    axes="main,mask,cms,predictor",
    families=",".join(MODELS),                # the models of the main comparison: bert,crossbert,electra
    seeds=0,                  # training seeds per main run (train.py's seed 1337, 1338, ...); 0 = the preset's
    budgets="",               # a comma-separated subset of the preset's FLOP budgets, to 2 digits as in the run names
                              # (e.g. 2.7e14: a long sweep's seeds at its largest budget first); "" = every budget
    # the primary instrument: task folders (train.tsv, dev.tsv), or a folder of them; their average is linear_avg/knn_avg
    tasks="../shared/devtasks",
    glue_tasks="SST-2,CoLA,MRPC,STS-B,RTE,WNLI",  # the paper's table, as glue_linear_avg/glue_knn_avg; "" = skip
    glue_dir="../shared/glue",
    sts="../shared/glue/STS-B",               # zero-shot STS (embed.py); "" = skip
    nproc=0,                  # processes per run (torchrun); 0 = the preset's
    micro_batch=0,            # rows per micro-step per process, at most; 0 = the preset's (what fits its device)
    random_seeds=3,           # random-init twins per family and shape (at least one per training seed): twin i holds
                              # the initial weights of training seed i, so each run is compared with where it started
    compile=True,
    device="cuda" if torch.cuda.is_available() else "cpu",  # where checkpoints and their twins are probed
)


def split_batch(tokens, block_size, nproc, cap):
    """(total_batch_size, micro-batch rows): whole rows near `tokens`, split evenly over the processes, each
    process's rows cut into the fewest equal micro-steps of at most `cap` rows. Rows are rounded to make the
    micro-steps equal, so a micro-batch is never a small divisor of an awkward row count."""
    rows = max(1, round(tokens / (block_size * nproc)))  # per process
    micro_steps = -(-rows // cap)
    micro = -(-rows // micro_steps)
    return micro * micro_steps * nproc * block_size, micro


def run_settings(p, n_layer, n_embd, n_head, model_type, flops, **extra):
    """train.py settings for one run with a FLOP budget: lr and batch from the power laws."""
    F0, lr0, batch0 = p["anchor"]
    total, micro = split_batch(batch0 * (flops / F0) ** BATCH_EXP, p["block_size"], p["nproc"], p["micro_batch"])
    s = dict(model_type=model_type, n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=p["block_size"],
             dataset=p["dataset"], vocab_size=p["vocab_size"], max_flops=float(flops),
             learning_rate=lr0 * (flops / F0) ** LR_EXP, total_batch_size=total, batch_size=micro)
    s.update(min_lr=s["learning_rate"] / 10, **extra)
    s["warmup_iters"] = max(1, steps_for(s)[0] // 20)  # 5% of the run
    return s


def accumulation(s, nproc):
    """Micro-steps per optimizer step in each process."""
    return s["total_batch_size"] // s["block_size"] // nproc // s["batch_size"]


def steps_for(s):
    """How many steps train.py will take: the most that fit in max_flops, or max_iters."""
    rows = s["total_batch_size"] // s["block_size"]
    per_step = training_flops(make_config(s), s["model_type"], rows)
    return budget_steps(s["max_flops"], per_step) if s.get("max_flops") else s["max_iters"], per_step


def short(flops):
    """A FLOP budget to 2 digits, as run names and --budgets write it: 1.35e14 -> 1.4e14."""
    return f"{flops:.2g}".replace("e+", "e")


def size_budget(p, i):
    """The training FLOPs of the preset's i-th size: its explicit budget, or tokens_per_param tokens per
    parameter, counted on BERT (the baseline every budget is quoted for)."""
    if p["flops"][i]:
        return p["flops"][i]
    L, C, H = p["sizes"][i]
    cfg = make_config(dict(model_type="bert", n_layer=L, n_embd=C, n_head=H, block_size=p["block_size"],
                           vocab_size=p["vocab_size"]))
    return p["tokens_per_param"] * param_counts(cfg, "bert")[0] * training_flops(cfg, "bert") / cfg.block_size


def plan(p, axes, families=tuple(MODELS), seeds=1, budgets=None):
    """[(name, axis, train.py settings)] for the preset; main runs once per training seed (name suffix -s1, -s2..).
    A size that appears at several budgets gets the budget in its name. budgets: only these ("2.7e14", ..)."""
    runs = []
    repeated = {size for size in p["sizes"] if p["sizes"].count(size) > 1}
    for i, (L, C, H) in enumerate(p["sizes"]):
        budget = size_budget(p, i)
        tag = f"-{short(budget)}" if (L, C, H) in repeated else ""
        if budgets is not None and short(budget) not in budgets:
            continue
        # seed by seed, every family at each seed: a sweep stopped part way has families to compare, paired by seed
        for k in range(seeds):
            for model_type in families:
                # the ablations below vary BERT's and CrossBERT's masking: those two are their reference
                if "main" in axes or (i == p["ablation_size"] and model_type in ("bert", "crossbert")):
                    runs.append((f"{model_type}-{L}x{C}{tag}" + (f"-s{k}" if k else ""), "main",
                                 run_settings(p, L, C, H, model_type, budget, seed=1337 + k)))
        if i != p["ablation_size"]:
            continue
        size = f"{L}x{C}"
        if "mask" in axes:
            runs.append((f"bert-{size}-mask0.5", "mask", run_settings(p, L, C, H, "bert", budget, mask_ratio=0.5)))
            runs.append((f"crossbert-{size}-mask0.75", "mask",
                         run_settings(p, L, C, H, "crossbert", budget, mask_ratio=0.75)))
        if "predictor" in axes:
            runs.append((f"crossbert-{size}-pred{max(2, L // 2)}", "predictor",
                         run_settings(p, L, C, H, "crossbert", budget, pred_layer=max(2, L // 2))))
        if "cms" in axes:  # CMS off sees as many unique tokens as the main CrossBERT run: same steps, half the FLOPs
            main = run_settings(p, L, C, H, "crossbert", budget)
            off = dict(main, cms=False, max_flops=0.0, max_iters=steps_for(main)[0])
            runs.append((f"crossbert-{size}-nocms", "cms", off))
    return runs


# -----------------------------------------------------------------------------
# Running and probing


def train(name, s, run_dir, nproc, compile):
    """Train one run (or resume it from its checkpoint); its log goes to run_dir/train.log."""
    args = {**s, "out_dir": run_dir, "compile": compile,
            "init_from": "resume" if os.path.exists(os.path.join(run_dir, "ckpt.pt")) else "scratch"}
    launcher = [sys.executable, "train.py"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]
    cmd = launcher + [f"--{k}={v}" for k, v in args.items() if v != ""]
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "train.log"), "a") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        sys.exit(f"sweep: run {name} failed (exit {done.returncode}); see {run_dir}/train.log, then rerun "
                 "the same command to continue the sweep")


def read_log(run_dir):
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def task_list(spec):
    """Task names or folders from a comma-separated list, where a folder without train.tsv stands for its subfolders
    (e.g. ../shared/devtasks)."""
    out = []
    for t in filter(None, spec.split(",")):
        is_parent = os.path.isdir(t) and not os.path.exists(os.path.join(t, "train.tsv"))
        out += sorted(os.path.join(t, d) for d in os.listdir(t) if os.path.isdir(os.path.join(t, d))) if is_parent else [t]
    return out


def evaluate(model, tasks, glue_tasks, glue_dir, sts, max_train):
    """Frozen-probe scores of a model: {"TASK/linear": %, "TASK/knn": %, ...}, the averages over the primary tasks
    (linear_avg, knn_avg) and over GLUE (glue_linear_avg, glue_knn_avg), and zero-shot STS (sts_zero_shot)."""
    from embed import zero_shot_sts
    from probe import probe_tasks
    scores = {}
    for prefix, names in (("", tasks), ("glue_", glue_tasks)):
        if names:
            got = probe_tasks(model, names, glue_dir or None, max_train)
            scores.update(got)
            for p in ("linear", "knn"):
                scores[f"{prefix}{p}_avg"] = float(np.mean([v for k, v in got.items() if k.endswith("/" + p)]))
    if sts:
        scores["sts_zero_shot"] = zero_shot_sts(model, sts)
    return scores


# -----------------------------------------------------------------------------
# Report: the table and the plots


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
       15: 2.13, 20: 2.09, 30: 2.04}  # Student's t, two-sided 95%, by degrees of freedom


def t95(df):
    """Student's t for a two-sided 95% interval; between the table's entries, the next smaller df's (wider)."""
    return T95[max(k for k in T95 if k <= df)] if df < 60 else 1.96


def interval(xs):
    """(mean, sd, half-width of the 95% t-interval of the mean) of a list; sd and half-width are None for one value."""
    m = float(np.mean(xs))
    if len(xs) < 2:
        return m, None, None
    sd = float(np.std(xs, ddof=1))
    return m, sd, t95(len(xs) - 1) * sd / math.sqrt(len(xs))


def fmt(xs, signed=False, places=1):
    m, sd, hw = interval(xs)
    f = f"{'+' * signed}.{places}f"
    if sd is None:
        return f"{m:{f}} (1 seed)"
    return f"{m:{f}} [{m - hw:{f}}, {m + hw:{f}}]" if signed else f"{m:{f}} ± {sd:.{places}f}"


def trend(points):
    """The least-squares line through (log2 FLOPs, trained − init) points, one per training seed and budget: its slope
    in points per doubling of FLOPs, with a 95% half-width, and the log2 FLOPs where it crosses 0, with a 95%
    half-width (delta method; None for a flat line). None for fewer than 3 points or one budget. The crossing is an
    extrapolation when it lies beyond the budgets measured: the line is an assumption there, so the range is a lower
    bound on the uncertainty."""
    x, y = np.log2([p[0] for p in points]), np.array([p[1] for p in points], dtype=float)
    if len(x) < 3 or len(set(x)) < 2:
        return None
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    slope = ((x - xm) * (y - ym)).sum() / sxx
    s2 = ((y - ym - slope * (x - xm)) ** 2).sum() / (len(x) - 2)  # the residual variance
    t = t95(len(x) - 2)
    slope_hw = t * math.sqrt(s2 / sxx)
    if slope == 0:
        return slope, slope_hw, None, None
    x0 = xm - ym / slope  # where the line is 0; the mean and the slope of a centred fit are independent
    x0_hw = t * math.sqrt(s2 / len(x) / slope ** 2 + ym ** 2 * s2 / sxx / slope ** 4)
    return float(slope), slope_hw, float(x0), x0_hw


def seed_of(r):
    return r.get("seed", 0)


def shape_of(r):
    return r.get("shape") or f"{r['settings']['n_layer']}x{r['settings']['n_embd']}"


def init_diffs(rs, twins, key):
    """trained − init on score `key` for each run of rs whose twin (its family's, shape's and seed's random run)
    is in twins, a dict (family, shape) -> {seed: scores}."""
    return [r["scores"][key] - twins[r["model_type"], shape_of(r)][seed_of(r)][key] for r in rs
            if seed_of(r) in twins.get((r["model_type"], shape_of(r)), {})]


def crossing(rs, twins, key):
    """One row of the crossing table for a family's main runs rs: the first budget where trained beats its random
    twins (paired by seed, the interval above 0), and the trend of trained − init over budgets."""
    by_budget = {}
    for r in rs:
        by_budget.setdefault(r["settings"]["max_flops"], []).append(r)
    diffs = {b: d for b, runs in sorted(by_budget.items()) if (d := init_diffs(runs, twins, key))}
    first = next((b for b, d in diffs.items() if verdict(d) == "above"), None)
    reached = f"{first:.2e} ({fmt(diffs[first], True)})" if first else "not reached"
    fit = trend([(b, x) for b, d in diffs.items() for x in d])
    if fit is None:
        return [reached, "one budget: no trend yet", "-"]
    slope, hw, x0, x0_hw = fit
    if first:
        where = "-"
    elif slope - hw <= 0:
        where = "no rise beyond its interval: not extrapolated"
    elif x0 + x0_hw < 1000:  # FLOPs as a number while a float holds them
        where = f"{2 ** x0:.1e} [{2 ** (x0 - x0_hw):.1e}, {2 ** (x0 + x0_hw):.1e}]"
    else:
        where = f"2^{x0:.0f} [2^{x0 - x0_hw:.0f}, 2^{x0 + x0_hw:.0f}]"
    return [reached, f"{slope:+.2f} [{slope - hw:+.2f}, {slope + hw:+.2f}]", where]


def verdict(diffs):
    m, _, hw = interval(diffs)
    if hw is None:
        return "one seed: no interval"
    return "above" if m - hw > 0 else "below" if m + hw < 0 else "not distinguishable"


def summarize(results):
    """The sweep's answer, as markdown: each main cell against its random twins, and the families against each other
    at equal FLOPs, on the primary average (linear_avg, knn_avg). Differences are paired by training seed: a run
    against its own initial weights (the twin of the same seed), CrossBERT seed k against BERT seed k (the same
    data order). Intervals are 95% Student-t intervals of the mean difference over seeds; mean ± sd elsewhere."""
    main = [r for r in results if r["axis"] == "main"]
    twins = {}  # (family, shape) -> {seed: scores}
    for r in results:
        if r["axis"] == "random":
            twins.setdefault((r["model_type"], shape_of(r)), {})[seed_of(r)] = r["scores"]
    cells = {}
    for r in main:
        cells.setdefault(r.get("cell", r["name"]), []).append(r)
    lines = ["## Trained against random init", "",
             "Primary average (linear / kNN probes), mean ± sd over training seeds; random init: the twins of that "
             "family and shape (twin k = training seed k's initial weights); trained − init paired by seed, "
             "[95% interval].", "",
             "| cell | train FLOPs | seeds | val loss | unigram | linear | init linear | trained − init | kNN | "
             "init kNN | trained − init | verdict (linear / kNN) |", "|" + "---|" * 12]
    for name, rs in sorted(cells.items(), key=lambda kv: (kv[1][0]["model_type"], kv[1][0]["flops"])):
        tw = twins.get((rs[0]["model_type"], shape_of(rs[0])), {})
        row = [name, f"{np.mean([r['flops'] for r in rs]):.2e}", str(len(rs)), fmt([r["val_loss"] for r in rs], places=3),
               f"{rs[0]['unigram_loss']:.3f}"]
        verdicts = []
        for key in ("linear_avg", "knn_avg"):
            paired = init_diffs(rs, twins, key)
            row += [fmt([r["scores"][key] for r in rs]), fmt([t[key] for t in tw.values()]) if tw else "-",
                    fmt(paired, signed=True) if paired else "-"]
            verdicts.append(verdict(paired) if paired else "-")
        lines.append("| " + " | ".join(row + [" / ".join(verdicts)]) + " |")
    lines += ["", "## The crossing", "", "The smallest budget at which a family's trained runs beat their random twins "
              "(the 95% interval of trained − init above 0), and the least-squares trend of trained − init against "
              "log2 FLOPs (every seed a point) in points per doubling, [95% interval]; where no budget beats the "
              "twins yet and the trend rises, the FLOPs where the line reaches 0 (an extrapolation, [95% range]).", "",
              "| family | probe | beats its twins from | trend per doubling | extrapolated crossing (FLOPs) |",
              "|" + "---|" * 5]
    for fam in sorted({r["model_type"] for r in main}):
        rs = [r for r in main if r["model_type"] == fam]
        for key, probe in (("linear_avg", "linear"), ("knn_avg", "kNN")):
            lines.append("| " + " | ".join([fam, probe] + crossing(rs, twins, key)) + " |")
    lines += ["", "## Families at equal FLOPs", "", "CrossBERT minus each baseline, and ELECTRA minus BERT, at the same "
              "budget and shape, paired by training seed, [95% interval].", "",
              "| budget | shape | comparison | seeds | linear | kNN | verdict (linear / kNN) |", "|" + "---|" * 7]
    budgets = {}
    for r in main:
        budgets.setdefault((r["settings"]["max_flops"], shape_of(r)), {}).setdefault(r["model_type"], {})[seed_of(r)] = r
    for (budget, shp), fams in sorted(budgets.items()):
        for fam, ref in (("crossbert", "bert"), ("electra", "bert"), ("crossbert", "electra")):
            common = sorted(set(fams.get(fam, ())) & set(fams.get(ref, ())))
            if not common:
                continue
            diffs = {key: [fams[fam][k]["scores"][key] - fams[ref][k]["scores"][key] for k in common]
                     for key in ("linear_avg", "knn_avg")}
            lines.append(f"| {budget:.2e} | {shp} | {fam} − {ref} | {len(common)} | {fmt(diffs['linear_avg'], True)} | "
                         f"{fmt(diffs['knn_avg'], True)} | {verdict(diffs['linear_avg'])} / {verdict(diffs['knn_avg'])} |")
    return "\n".join(lines) + "\n"


def table(results):
    tasks = sorted({k.rsplit("/", 1)[0] for r in results for k in r["scores"] if "/" in k})
    glue = any("glue_linear_avg" in r["scores"] for r in results)
    head = ["run", "axis", "params (M)", "train FLOPs", "steps", "input tokens", "val loss", "unigram",
            "linear avg", "kNN avg"] + ["GLUE linear", "GLUE kNN"] * glue + ["STS 0-shot"] + [f"{t} lin/kNN" for t in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        sc = r["scores"]
        cells = [r["name"], r["axis"], f"{r['params'] / 1e6:.2f}", f"{r['flops']:.2e}" if r["flops"] else "0",
                 str(r["steps"]), f"{r['tokens']:,}", f"{r['val_loss']:.3f}" if r["val_loss"] else "-",
                 f"{r['unigram_loss']:.3f}" if r["unigram_loss"] else "-", f"{sc['linear_avg']:.1f}",
                 f"{sc['knn_avg']:.1f}"]
        cells += [f"{sc[k]:.1f}" if k in sc else "-" for k in ("glue_linear_avg", "glue_knn_avg")] * glue
        cells += [f"{sc['sts_zero_shot']:.1f}" if "sts_zero_shot" in sc else "-"]
        cells += [f"{sc[t + '/linear']:.1f} / {sc[t + '/knn']:.1f}" if t + "/linear" in sc else "-" for t in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(results, out_dir):
    """Draws the sweep's figures into out_dir; returns their file names (none without matplotlib, an optional extra)."""
    if importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(zip(MODELS, ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange")))
    main = [r for r in results if r["axis"] == "main"]
    written = []

    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axs, ("linear_avg", "knn_avg", "sts_zero_shot"),
                              ("linear probe, primary average", "kNN probe, primary average",
                               "zero-shot STS (Spearman)")):
        for fam in colors:
            cells = {}  # budget -> this family's scores over training seeds, and its shape's random twins
            for r in main:
                if r["model_type"] == fam and key in r["scores"]:
                    cells.setdefault(r["flops"] and r["settings"]["max_flops"], (shape_of(r), []))[1].append(r["scores"][key])
            if not cells:
                continue
            xs = sorted(cells)
            ax.errorbar(xs, [np.mean(cells[x][1]) for x in xs], fmt="o-", color=colors[fam], capsize=3, label=fam,
                        yerr=[np.std(cells[x][1], ddof=1) if len(cells[x][1]) > 1 else 0 for x in xs])
            twins = [[t["scores"][key] for t in results if t["axis"] == "random" and t["model_type"] == fam
                      and shape_of(t) == cells[x][0] and key in t["scores"]] for x in xs]
            if all(twins):
                ax.errorbar(xs, [np.mean(t) for t in twins], yerr=[np.std(t, ddof=1) if len(t) > 1 else 0 for t in twins],
                            fmt="x--", color=colors[fam], alpha=0.6, capsize=3, label=f"{fam} random init")
        ax.set(xscale="log", xlabel="training FLOPs", title=title + " (mean ± sd over seeds)")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # decades only: no overlapping labels
        if ax.has_data():  # a score no run has (zero-shot STS with --sts=) leaves its panel empty
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "probe_vs_flops.png"), dpi=120)
    written.append("probe_vs_flops.png")

    fig, ax = plt.subplots(figsize=(6, 4.2))
    budgets = sorted({r["settings"]["max_flops"] for r in main})
    for r in main:  # colour: the family; line style: the size
        curve = [(x["flops"], x["val_loss"]) for x in r["log"] if "val_loss" in x and x["flops"]]
        style = ("-", "--", "-.", ":")[(len(budgets) - 1 - budgets.index(r["settings"]["max_flops"])) % 4]
        ax.plot(*zip(*curve), style, color=colors[r["model_type"]], alpha=0.8, label=r["name"])
        ax.axhline(r["unigram_loss"], color="gray", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="training FLOPs", ylabel="val masked-token loss (nats)",
           title="val loss (ELECTRA: its generator's; dotted: unigram)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "val_loss_vs_flops.png"), dpi=120)
    written.append("val_loss_vs_flops.png")

    cms = [r for r in results if r["axis"] == "cms"]
    if cms:
        ref = next((r for r in main if r["name"] == cms[0]["name"].removesuffix("-nocms")), None)
        fig, ax = plt.subplots(figsize=(6, 4.2))
        for r, label in ((ref, "CMS on (2 views)"), (cms[0], "CMS off (1 view)")):
            if r:
                curve = [(x["tokens"], x["val_loss"]) for x in r["log"] if "val_loss" in x and x["tokens"]]
                ax.plot(*zip(*curve), "o-", label=f"{label}: {r['name']}")
        ax.set(xlabel="unique training tokens", ylabel="val masked-token loss (nats)",
               title="complementary masking at equal unique tokens")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "cms_tokens.png"), dpi=120)
        written.append("cms_tokens.png")
    plt.close("all")
    return written


# -----------------------------------------------------------------------------


def main(argv):
    s = configure(settings, argv)
    if s["preset"] not in PRESETS:
        fail(f"--preset={s['preset']!r}: expected one of {', '.join(PRESETS)}")
    p = dict(PRESETS[s["preset"]])
    p["nproc"] = s["nproc"] or p["nproc"]
    p["micro_batch"] = s["micro_batch"] or p["micro_batch"]
    out_dir = s["out_dir"] or f"sweep-{s['preset']}"
    families = s["families"].split(",")
    unknown = [f for f in families if f not in MODELS]
    if unknown:
        fail(f"--families: unknown {', '.join(unknown)}; expected a comma-separated subset of {','.join(MODELS)}")
    unknown = [a for a in s["axes"].split(",") if a not in ("main", "mask", "cms", "predictor")]
    if unknown:  # an axis spelled wrong would leave it out of the plan, silently
        fail(f"--axes: unknown {', '.join(unknown)}; expected a comma-separated subset of main,mask,cms,predictor")
    for key in ("nproc", "micro_batch", "random_seeds", "seeds"):
        if s[key] < 0:
            fail(f"--{key}={s[key]}: must be >= 0" + (" (0 = the preset's)" if key != "random_seeds" else ""))
    seeds = s["seeds"] or p.get("seeds", 1)
    budgets = None
    if s["budgets"]:
        everything = [short(size_budget(p, i)) for i in range(len(p["sizes"]))]
        try:
            budgets = {short(float(b)) for b in s["budgets"].split(",")}
        except ValueError:
            fail(f"--budgets={s['budgets']}: expected comma-separated FLOP counts, e.g. --budgets=2.7e14")
        unknown = sorted(budgets - set(everything), key=float)
        if unknown:
            fail(f"--budgets: {', '.join(unknown)} not in preset {s['preset']}; its budgets are "
                 f"{','.join(dict.fromkeys(everything))}")
    runs = plan(p, s["axes"].split(","), families, seeds, budgets)
    extra = {k: v for k, v in (("dtype", p["dtype"]), ("eval_interval", p["eval_interval"])) if v}

    print(f"preset {s['preset']}: {len(runs)} runs on {p['dataset']}, {p['nproc']} process(es) each, into {out_dir}/")
    total_flops = total_s = 0
    for name, axis, rs in runs:
        steps, per_step = steps_for(rs)
        cfg = make_config(rs)
        est = steps * (per_step / p["flops_per_s"] + p["step_s"]) + p["overhead_s"]
        total_flops, total_s = total_flops + steps * per_step, total_s + est
        print(f"  {name:26s} {axis:9s} {param_counts(cfg, rs['model_type'])[0] / 1e6:7.2f}M params  "
              f"budget {rs['max_flops'] or steps * per_step:.2e} FLOPs = {steps:6d} steps x "
              f"{rs['total_batch_size']:7d} tokens ({p['nproc']} x {accumulation(rs, p['nproc'])} x "
              f"{rs['batch_size']} rows)  lr {rs['learning_rate']:.2e}  ~{est / 60:.1f} min")
    print("  (a step's rows: processes x micro-steps x rows per micro-step)")
    print(f"total {total_flops:.2e} training FLOPs, about {total_s / 60:.0f} minutes on this preset's hardware "
          f"({p['flops_per_s']:.1e} FLOP/s achieved, {p['step_s']} s per step and {p['overhead_s']} s per run on top)")
    if s["dry_run"]:
        return

    if s["glue_dir"] and not os.path.isdir(s["glue_dir"]):
        fail(f"--glue_dir={s['glue_dir']} is not a folder; pass a GLUE folder (TASK/train.tsv, dev.tsv), "
             "or --glue_dir= (empty) to load GLUE from the hub, or --tasks= with your own task folders")
    if s["sts"] and not os.path.exists(s["sts"]):
        fail(f"--sts={s['sts']} does not exist; pass STS-B's folder, or --sts= (empty) to skip zero-shot STS")
    tasks, glue_tasks, sts = task_list(s["tasks"]), task_list(s["glue_tasks"]), s["sts"]
    if not tasks:
        fail("--tasks is empty: the sweep needs the tasks its primary average is taken over")
    check_writable(out_dir, "--out_dir")
    data_dir = os.path.join(ROOT, "data", p["dataset"])
    if p["dataset"] != "tinybooks" and not os.path.exists(os.path.join(data_dir, "val.bin")):
        fail(f"data/{p['dataset']} is not prepared; prepare it first, e.g. python data/local/prepare.py "
             f"--input=../shared/corpus/{p['dataset']} --out_dir=data/{p['dataset']} (or a data/<corpus>/prepare.py)")
    for option, names in (("--tasks", tasks), ("--glue_tasks", glue_tasks)):
        try:  # the probes' tasks are read now, so a bad one stops the sweep before its first run, not after it
            for task in names:
                load_task(task, s["glue_dir"] or None, p["probe_max_train"])
        except EvalError as e:
            fail(f"{option}: {e}")

    os.makedirs(out_dir, exist_ok=True)
    results_path = os.path.join(out_dir, "results.jsonl")
    results = []
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = [json.loads(line) for line in f]
    done = {r["name"] for r in results}

    def write_table():
        tmp = os.path.join(out_dir, "results.md.tmp")
        with open(tmp, "w") as f:
            f.write(summarize(results) + "\n## Every run\n\n" + table(results))
        os.replace(tmp, os.path.join(out_dir, "results.md"))

    if importlib.util.find_spec("matplotlib") is None:
        print("sweep: matplotlib is not installed (pip install matplotlib); skipping the plots", file=sys.stderr)
    written = []

    def record(r):  # every run is kept as it finishes, the table and plots follow: a sweep stopped part way has all
        results.append(r)
        done.add(r["name"])
        with open(results_path, "a") as f:
            f.write(json.dumps(r) + "\n")
        write_table()
        written[:] = plots(results, out_dir)

    score = lambda m: evaluate(m, tasks, glue_tasks, s["glue_dir"], sts, p["probe_max_train"])
    for name, axis, rs in runs:
        run_dir = os.path.join(out_dir, name)
        seed, shape = rs.get("seed", 1337) - 1337, f"{rs['n_layer']}x{rs['n_embd']}"
        model = None  # this run's checkpoint, loaded once for its probes and its random twins
        if name not in done:
            t0 = time.time()
            print(f"sweep: training {name} ...", flush=True)
            train(name, {**rs, **extra}, run_dir, p["nproc"], s["compile"])
            t1 = time.time()
            model, ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"), s["device"])
            log = read_log(run_dir)
            vals = [x for x in log if "val_loss" in x]
            r = dict(name=name, cell=name.removesuffix(f"-s{seed}") if seed else name, seed=seed, shape=shape,
                     axis=axis, model_type=rs["model_type"], settings=rs, params=model.num_params(),
                     flops=ckpt["flops"], tokens=ckpt["tokens"], steps=ckpt["step"], val_loss=vals[-1]["val_loss"],
                     unigram_loss=next(x["unigram_loss"] for x in log if "unigram_loss" in x),
                     scores=score(model), log=vals, train_s=round(t1 - t0, 1), probe_s=round(time.time() - t1, 1))
            record(r)
            print(f"sweep: {name}: val loss {r['val_loss']:.3f} (unigram {r['unigram_loss']:.3f}), "
                  f"linear {r['scores']['linear_avg']:.1f}, kNN {r['scores']['knn_avg']:.1f} "
                  f"[{r['train_s']:.0f} s training, {r['probe_s']:.0f} s probing]", flush=True)
        # random twins of this family and shape: twin k holds training seed k's initial weights (the same seed and
        # construction as train.py), so trained minus twin is what training did to that init; shared by every budget
        for k in range(max(seeds, s["random_seeds"]) if axis == "main" else 0):
            twin = f"random-{rs['model_type']}-{shape}" + (f"-s{k}" if k else "")
            if twin in done:
                continue
            if model is None:
                model, _ = load_checkpoint(os.path.join(run_dir, "ckpt.pt"), s["device"])
            r = dict(name=twin, cell=f"random-{rs['model_type']}-{shape}", seed=k, shape=shape, axis="random",
                     model_type=rs["model_type"], settings=rs, params=model.num_params(), flops=0, tokens=0, steps=0,
                     val_loss=None, unigram_loss=None, scores=score(random_twin(model, 1337 + k)), log=[])
            record(r)
            print(f"sweep: {twin}: linear {r['scores']['linear_avg']:.1f}, kNN {r['scores']['knn_avg']:.1f}", flush=True)

    write_table()
    if not written:  # nothing finished in this call (a finished sweep run again): the plots of what is on record
        written = plots(results, out_dir)
    print(summarize(results))
    print(f"sweep: wrote {out_dir}/results.jsonl, results.md" + "".join(f", {w}" for w in written))


if __name__ == "__main__":
    with user_errors("sweep.py", EvalError):
        main(sys.argv[1:])
