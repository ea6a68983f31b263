"""
The ladder on one GPU: BERT and CrossBERT at 20 training tokens per parameter (sweep.py's ladder preset: web text,
block 128, the compact vocabulary, its learning-rate and batch laws), from 4 x 256 upward, the families FLOP-matched
at each rung, each run beside its random twin; writes experiments/results/gpu/ladder-<device>.md (and .json).

    python experiments/ladder_gpu.py            # one GPU, about 10 minutes: as many rungs as fit
    python experiments/ladder_gpu.py --smoke    # tiny rungs on the CPU, about a minute: the same code path

Rungs run smallest first. A rung starts only if its estimate fits in what is left of --minutes: for each family,
the rung before's fixed costs (start, compilation, evaluations, probes: they barely grow with size) plus this
rung's FLOPs at the rung before's training FLOP/s (its median step time; wider matrices run no slower). The report
says which rungs were reached and why the next was not. Every rung is written to the report as it ends. data/web
is prepared from --corpus (the web shards, ../shared/corpus/web) on first use.
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from checkpoint import load_checkpoint
from configurator import configure
from errors import UserError, check_device, check_writable, user_errors
from features import random_twin
from flops import param_counts
from model import make_config
from report import Report
from runs import (PRESETS, ROOT, RunFailed, prepare_dataset, probe_model, read_families, read_log, run_settings,
                  size_budget, steps_for, tokenized_tasks, train, trajectory)

settings = dict(
    smoke=False,              # tiny rungs, the built-in corpus, a fraction of a token per parameter: checks the path
    minutes=10.0,             # the whole run's target wall time
    sizes="4x256,6x384,8x512",  # the rungs, n_layer x n_embd (heads of 64 channels), smallest first
    families="bert,crossbert",  # the families at each rung, FLOP-matched
    tokens_per_param=20.0,    # training tokens per BERT parameter, embeddings included (as the ladder preset)
    dataset="web",            # a folder under data/ with train.bin and val.bin ...
    corpus="../shared/corpus/web/*.parquet",  # ... prepared from these files (data/local/prepare.py) if it has none
    tasks="../shared/devtasks",  # a folder of task folders (train.tsv, dev.tsv), or a comma-separated list of them
    max_train=2000,           # training examples per task for the probes, as on the CPU
    micro_batch=256,          # rows per micro-step, at most
    report="",                # "" = experiments/results/gpu/ladder-<device>.md
    work_dir="out-ladder",    # the runs' checkpoints and logs
    device="cuda" if torch.cuda.is_available() else "cpu",  # cpu, cuda or cuda:N
    compile=True,             # train.py's torch.compile
)
# a generous deadline: a slow CPU busy with other work must still reach the second rung
SMOKE = dict(minutes=30.0, sizes="1x32,2x64", tokens_per_param=0.02, dataset="tinybooks", max_train=200, compile=False,
             micro_batch=16)


def rungs(s):
    """[(n_layer, n_embd, n_head)] of --sizes."""
    try:
        sizes = [(int(L), int(C)) for L, C in (size.split("x") for size in s["sizes"].split(","))]
    except ValueError:
        raise UserError(f"--sizes={s['sizes']}: expected n_layer x n_embd pairs, e.g. 4x256,6x384") from None
    bad = [f"{L}x{C}" for L, C in sizes if C % 64 and C % 32]
    if bad:
        raise UserError(f"--sizes: {', '.join(bad)} cannot split into heads of 32 or 64 channels; use widths in "
                        "steps of 32")
    return [(L, C, C // 64 if C % 64 == 0 else C // 32) for L, C in sizes]


def train_rung(s, p, size, budget):
    """{family: what its run did}: each family trained by train.py at `budget` FLOPs, then probed with its twin."""
    L, C, H = size
    out = {}
    for fam in s["families"].split(","):
        r = run_settings(p, L, C, H, fam, budget, seed=1337, device=s["device"], compile=s["compile"])
        steps = steps_for(r)[0]
        r.update(eval_interval=max(1, steps // 4), eval_iters=20, overwrite=True, snapshots=6)
        run_dir = os.path.join(s["work_dir"], f"{fam}-{L}x{C}")
        t0 = time.time()
        try:
            train(f"{fam}-{L}x{C}", r, run_dir, 1, s["compile"])
        except RunFailed as e:  # a run that fails is reported, and the ladder stops there
            out[fam] = dict(error=str(e))
            break
        seconds = time.time() - t0
        log = read_log(run_dir)
        vals = [x for x in log if "val_loss" in x]
        step_s = statistics.median(x["ms_per_step"] for x in log if "ms_per_step" in x) / 1000
        model, ckpt = load_checkpoint(os.path.join(run_dir, "ckpt.pt"), s["device"])
        t1 = time.time()
        every = list(range(L + 1))  # every layer, 0 = the token embeddings
        layers = dict(trained=probe_model(model, s["task_data"], 64, every),
                      twin=probe_model(random_twin(model, r["seed"]), s["task_data"], 64, every))
        scores = {k: v[L] for k, v in layers.items()}
        # the probes along training: train.py's snapshots at 1/32 .. 1/2 of the run
        along = trajectory(run_dir, s["device"], lambda m: probe_model(m, s["task_data"], 64, every))
        out[fam] = dict(settings=r, train_s=seconds, train_rate=ckpt["flops"] / ckpt["step"] / step_s,  # FLOP/s
                        probe_s=time.time() - t1, flops=ckpt["flops"], tokens=ckpt["tokens"], steps=ckpt["step"],
                        params=model.num_params(),
                        val_loss=vals[-1]["val_loss"], unigram=log[0]["unigram_loss"], layers=layers,
                        trajectory=along, code=ckpt.get("code"), **scores)  # code: what trained it
    return out


def estimate(runs, budget):
    """Seconds the next rung should take, from what the last rung's runs did: each family's fixed cost (its wall
    time less its FLOPs at its training FLOP/s, plus its probes) does not grow with FLOPs; its steps do."""
    return sum(r["train_s"] - r["flops"] / r["train_rate"] + r["probe_s"] + budget / r["train_rate"]
               for r in runs.values())


def rung_table(size, budget, params, runs):
    L, C, _ = size
    rows = []
    for fam, r in runs.items():
        if "error" in r:
            rows.append(f"| {fam} | failed: {' '.join(r['error'].split())[:300]} |")
            continue
        t, w = r["trained"], r["twin"]
        rows.append(f"| {fam} | {r['params'] / 1e6:.2f} | {r['tokens'] / 1e6:.1f} | {r['tokens'] / params:.1f} | "
                    f"{r['flops']:.2e} | {r['steps']} | {r['train_s']:.0f} | {r['val_loss']:.3f} | {r['unigram']:.3f} | "
                    f"{t['linear_avg']:.1f} | {w['linear_avg']:.1f} | {t['linear_avg'] - w['linear_avg']:+.1f} | "
                    f"{t['knn_avg']:.1f} | {w['knn_avg']:.1f} | {t['knn_avg'] - w['knn_avg']:+.1f} |")
    md = (f"## {L} x {C}: {budget:.2e} training FLOPs a family ({params / 1e6:.2f}M BERT parameters)\n\n"
          "| family | params (M) | input tokens (M) | per BERT parameter | FLOPs | steps | train s | val loss | unigram | "
          "linear | twin | trained − twin | kNN | twin | trained − twin |\n|" + "---|" * 15 + "\n" + "\n".join(rows))
    if all(f in runs and "error" not in runs[f] for f in ("bert", "crossbert")):
        b, c = runs["bert"]["trained"], runs["crossbert"]["trained"]
        md += (f"\n\nCrossBERT − BERT at equal FLOPs: linear {c['linear_avg'] - b['linear_avg']:+.1f}, "
               f"kNN {c['knn_avg'] - b['knn_avg']:+.1f} (one seed each).")
    done = {fam: r for fam, r in runs.items() if "error" not in r}
    md += ("\n\nBy layer (0 = the token embeddings; linear / kNN): last − best is below 0 when the last layers serve "
           "reconstruction; last − layer 0 is what context adds.\n\n| family | trained | twin | best layer (linear) | "
           "last − best | last − layer 0 | twin: last − layer 0 |\n|" + "---|" * 7)
    for fam, r in done.items():
        cols = []
        for which in ("trained", "twin"):
            by = r["layers"][which]
            cols.append(", ".join(f"{by[i]['linear_avg']:.1f} / {by[i]['knn_avg']:.1f}" for i in sorted(by)))
        by, tw = r["layers"]["trained"], r["layers"]["twin"]
        best, last = max(by, key=lambda i: by[i]["linear_avg"]), max(by)
        cols += [str(best), f"{by[last]['linear_avg'] - by[best]['linear_avg']:+.1f}",
                 f"{by[last]['linear_avg'] - by[0]['linear_avg']:+.1f} / {by[last]['knn_avg'] - by[0]['knn_avg']:+.1f}",
                 f"{tw[last]['linear_avg'] - tw[0]['linear_avg']:+.1f} / {tw[last]['knn_avg'] - tw[0]['knn_avg']:+.1f}"]
        md += f"\n| {fam} | " + " | ".join(cols) + " |"
    md += ("\n\nAlong training (last layer, linear / kNN; FLOPs 0 is the twin):\n\n| family | step | FLOPs | val loss | "
           "linear | kNN |\n|" + "---|" * 6)
    for fam, r in done.items():
        points = [(0, 0.0, None, r["twin"])] + [(p["step"], p["flops"], p["val_loss"], p["layers"][max(p["layers"])])
                                                for p in r["trajectory"]] + [(r["steps"], r["flops"], r["val_loss"],
                                                                              r["trained"])]
        for step, flops, val, sc in points:
            md += (f"\n| {fam} | {step} | {flops:.2e} | {'-' if val is None else f'{val:.3f}'} | "
                   f"{sc['linear_avg']:.1f} | {sc['knn_avg']:.1f} |")
    return md


def main(argv):
    s = configure(settings, argv, help_from=[__file__])
    if s["smoke"]:
        s.update({k: v for k, v in SMOKE.items() if f"--{k}" not in {a.split("=")[0] for a in argv}})
    sizes = rungs(s)
    read_families(s["families"])  # checked before the first rung
    check_device(s["device"])
    name = torch.cuda.get_device_name(s["device"]) if s["device"].startswith("cuda") else "cpu"
    report_path = s["report"] or os.path.join(ROOT, "experiments", "results", "gpu",
                                              f"ladder-{name.replace(' ', '-')}.md")
    check_writable(report_path, "--report", folder=False)
    check_writable(s["work_dir"], "--work_dir")
    t_start = time.time()
    deadline = t_start + 60 * s["minutes"]
    s["task_data"] = tokenized_tasks(s["tasks"], s["max_train"], 128)
    corpus_tokens = prepare_dataset(s["dataset"], s["corpus"])
    p = dict(PRESETS["ladder"], sizes=sizes, flops=[0] * len(sizes), tokens_per_param=s["tokens_per_param"],
             dataset=s["dataset"], nproc=1, micro_batch=s["micro_batch"])
    header = (f"# The ladder on {name}\n\n{time.strftime('%Y-%m-%d')}, torch {torch.__version__}; "
              f"`python experiments/ladder_gpu.py {' '.join(argv)}` (target {s['minutes']:g} min). "
              f"{s['tokens_per_param']:g} training tokens per BERT parameter (embeddings included), "
              f"data/{s['dataset']} ({corpus_tokens / 1e6:.1f}M training tokens), block 128, vocabulary 8,192; "
              f"probes: {len(s['task_data'])} tasks, max_train {s['max_train']}, twin = the run's initial weights."
              + ("\n\n**Smoke run**: tiny rungs on the built-in corpus; it checks the path and measures nothing."
                 if s["smoke"] else ""))
    report = Report(report_path, header)
    report.add("setup (tasks tokenized, corpus checked)", time.time() - t_start, None)
    last = None  # the last rung's runs, which the next one's estimate comes from
    for i, size in enumerate(sizes):
        budget = size_budget(p, i)
        params = param_counts(make_config(dict(model_type="bert", n_layer=size[0], n_embd=size[1], n_head=size[2],
                                               block_size=128, vocab_size=8192)), "bert")[0]
        left, need = deadline - time.time(), estimate(last, budget) if last else 0
        if need > left:
            rates = ", ".join(f"{fam} {r['train_rate']:.2e}" for fam, r in last.items())
            report.add(f"{size[0]}x{size[1]} not run", 0, f"## {size[0]} x {size[1]}: not run\n\nIts estimate, "
                       f"{need:.0f} s ({budget:.2e} FLOPs a family at the last rung's training FLOP/s, {rates}, "
                       f"plus its fixed costs), exceeds the {left:.0f} s left.")
            break
        t0 = time.time()
        last = runs = train_rung(s, p, size, budget)
        report.add(f"{size[0]}x{size[1]}", time.time() - t0, rung_table(size, budget, params, runs),
                   json.loads(json.dumps(runs, default=float)))
        if any("error" in r for r in runs.values()):  # a failed run stops the ladder
            break
    print(f"ladder: wrote {report_path}")


if __name__ == "__main__":
    with user_errors("ladder_gpu.py"):
        main(sys.argv[1:])
