"""
The paper's comparison at your scale: BERT, CrossBERT and ELECTRA families trained at matched training
FLOPs, every final checkpoint probed frozen, next to random-init twins of the same shape.

    python experiments/sweep.py --preset=cpu --dry_run      # the plan: runs, FLOPs, estimated time; trains nothing
    python experiments/sweep.py --preset=cpu --tasks=DIR/devtasks --glue_dir=DIR/glue --sts=DIR/glue/STS-B  # 2 cores
    python experiments/sweep.py --preset=gpu --nproc=8 ...  # one 8-GPU node over the paper's range (needs DCLM)
    python experiments/sweep.py --preset=cpu --tasks=path/a,path/b --glue_tasks= --sts=   # your own tasks only

The cpu preset takes under an hour on 2 CPU cores and writes sweep-cpu/; the others take the same task settings.

For each size, the BERT, CrossBERT and ELECTRA runs get the same FLOP budget (train.py's max_flops, counted
by flops.py): a tokens-per-parameter rule or the preset's explicit budgets. Batch size and learning rate
come from power laws in the budget. Every run writes its own out_dir under the sweep folder; a run
already in results.jsonl is skipped, and a run cut short resumes from its checkpoint, so rerunning the
same command continues the sweep. Outputs, in out_dir: results.jsonl (one record per run),
results.md (the table) and, with matplotlib installed, probe_vs_flops.png, val_loss_vs_flops.png and, with
the cms axis, cms-<shape>.png (probes and val loss against input tokens and against FLOPs).

Axes besides the main BERT-vs-CrossBERT comparison (the paper's ablations), seed by seed, at the preset's ablation size
(every size of --budgets for the ladder, whose default is --axes=main):
  mask      BERT at 20% and 50% masking, CrossBERT at 50%, 67% and 75% (a block 3 divides for 67%), all at the
            same FLOPs
  cms       CrossBERT with and without complementary masking at equal unique tokens (equal steps):
            the "2x sample efficiency" claim: val loss, and input tokens to the same probe score, against unique tokens
  predictor CrossBERT's predictor depth, at the same FLOPs
  lr        each family at --lr_scales times the power law's learning rate, at every size and seed of the plan:
            each family's own optimum (experiments/README.md); the law's own runs (x1) are the main axis
  replace   BERT with the 80/10/10 corruption (80% <mask>, 10% a random token, 10% unchanged) at each --lr_scales
            multiplier (x1 without it), at every size and seed of the plan: against all-<mask> BERT at the same rate
An ablation varies the families of --families only (--families=crossbert: no BERT at 50%).
"""
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from configurator import UserError, configure, make_config, user_errors
from plumbing.checks import at_least, check_device, check_writable, optional
from data.tasks import load_task, task_list
from evaluation.features import load_backbone, random_twin
from flops import cms_block, param_counts
from model import MODELS
from report import plots, summarize, write_markdown
from runs import (PRESETS, ROOT, RunFailed, read_families, read_lr_scales, run_record, run_settings, size_budget,
                  steps_for, train, trajectory, twin_record)

settings = dict(
    preset="cpu",             # cpu, cpu-gutenberg, ladder or gpu: sizes, budgets, corpus, hardware (runs.py's PRESETS)
    out_dir="",               # "" = sweep-<preset>
    dry_run=False,            # print the plan (runs, FLOPs, steps, batch, lr, estimated time) and train nothing
    axes="",                  # main, mask, cms, predictor, lr, replace (see above), comma-separated; "" = the preset's
    lr_scales="0.5,2",        # the lr and replace axes' multipliers of the power law's learning rate (and min_lr)
    families="",              # the models of the main comparison, e.g. bert,crossbert,electra; "" = the preset's
                              # (all three unless it says)
    seeds=0,                  # training seeds per main run (train.py's seed 1337, 1338, ...); 0 = the preset's
    budgets="",               # a comma-separated subset of the preset's FLOP budgets, to 2 digits as in the run names
                              # (e.g. 2.7e14: a long sweep's seeds at its largest budget first); "" = every budget
    tasks="",                 # the primary instrument (needed), averaged as linear_avg/knn_avg: task folders
                              # (train.tsv, dev.tsv), or a folder of them, e.g. DIR/devtasks
    glue_tasks="SST-2,CoLA,MRPC,STS-B,RTE,WNLI",  # the paper's table, as glue_linear_avg/glue_knn_avg; "" = skip
    glue_dir="",              # GLUE's task folders (needed for --glue_tasks), e.g. DIR/glue; hub = from the hub
    sts="",                   # zero-shot STS (embed.py): STS-B's folder, e.g. DIR/glue/STS-B; "" = skip
    nproc=0,                  # processes per run (torchrun); 0 = the preset's
    micro_batch=0,            # rows per micro-step per process, at most; 0 = the preset's (what fits its device)
    random_seeds=3,           # random-init twins per family and shape (at least one per training seed): twin i holds
                              # the initial weights of training seed i, so each run is compared with where it started
    compile=True,             # train.py's torch.compile
    device="cuda" if torch.cuda.is_available() else "cpu",  # where checkpoints and their twins are probed
)


def accumulation(s, nproc):
    """Micro-steps per optimizer step in each process."""
    return s["total_batch_size"] // s["block_size"] // nproc // s["batch_size"]


def short(flops):
    """A FLOP budget to 2 digits, as run names and --budgets write it: 1.35e14 -> 1.4e14."""
    return f"{flops:.2g}".replace("e+", "e")


def plan(p, axes, families=tuple(MODELS), seeds=1, budgets=None, lr_scales=()):
    """[(name, axis, train.py settings)] for the preset; main runs once per training seed (name suffix -s1, -s2..).
    A size that appears at several budgets gets the budget in its name. budgets: only these ("2.7e14", ..).
    lr_scales: the lr axis's multipliers, each a run per family and seed (name suffix -lr<scale> before -s<k>)."""
    runs = []
    repeated = {size for size in p["sizes"] if p["sizes"].count(size) > 1}
    for i, (L, C, H) in enumerate(p["sizes"]):
        budget = size_budget(p, i)
        tag = f"-{short(budget)}" if (L, C, H) in repeated else ""
        if budgets is not None and short(budget) not in budgets:
            continue
        # the ablations asked for: at the preset's ablation size, or at every size of the plan for a preset without one
        ablate = p["ablation_size"] in (None, i) and any(a in axes for a in ("mask", "cms", "predictor"))
        # seed by seed, every family at each seed: a sweep stopped part way has families to compare, paired by seed
        for k in range(seeds):
            seed, sfx = 1337 + k, f"-s{k}" if k else ""
            for model_type in families:
                # the ablations below vary BERT's and CrossBERT's masking: those two are their reference
                if "main" in axes or (ablate and model_type in ("bert", "crossbert")):
                    runs.append((f"{model_type}-{L}x{C}{tag}{sfx}", "main",
                                 run_settings(p, L, C, H, model_type, budget, seed=seed)))
                for m in lr_scales if "lr" in axes else ():
                    rs = run_settings(p, L, C, H, model_type, budget, seed=seed)
                    rs.update(learning_rate=rs["learning_rate"] * m, min_lr=rs["min_lr"] * m)
                    runs.append((f"{model_type}-{L}x{C}{tag}-lr{m:g}{sfx}", "lr", rs))
                # BERT's 80/10/10 corruption at each multiplier of --lr_scales (x1 without it): the standard baseline
                for m in (lr_scales or [1.0]) if "replace" in axes and model_type == "bert" else ():
                    rs = run_settings(p, L, C, H, model_type, budget, seed=seed, random_replace=True)
                    rs.update(learning_rate=rs["learning_rate"] * m, min_lr=rs["min_lr"] * m)
                    lr = f"-lr{m:g}" if m != 1 else ""
                    runs.append((f"bert-{L}x{C}{tag}{lr}-801010{sfx}", "replace", rs))
            if not ablate:
                continue
            size = f"{L}x{C}{tag}"
            if "mask" in axes and "bert" in families:
                runs.append((f"bert-{size}-mask0.5{sfx}", "mask",
                             run_settings(p, L, C, H, "bert", budget, mask_ratio=0.5, seed=seed)))
            if "crossbert" not in families:  # the other ablations vary CrossBERT
                continue
            if "mask" in axes:
                for ratio in (2 / 3, 0.75):  # the paper's ratios above the main run's 0.5: 3 and 4 complementary views
                    q = dict(p, block_size=cms_block(p["block_size"], ratio))  # 126 of 128 for three views
                    runs.append((f"crossbert-{size}-mask{ratio:.3g}{sfx}", "mask",
                                 run_settings(q, L, C, H, "crossbert", budget, mask_ratio=ratio, seed=seed)))
            if "predictor" in axes:
                runs.append((f"crossbert-{size}-pred{max(2, L // 2)}{sfx}", "predictor",
                             run_settings(p, L, C, H, "crossbert", budget, pred_layer=max(2, L // 2), seed=seed)))
            if "cms" in axes:  # CMS off sees as many unique tokens as the main CrossBERT run: same steps, half FLOPs
                main = run_settings(p, L, C, H, "crossbert", budget, seed=seed)
                off = dict(main, cms=False, max_flops=0.0, max_iters=steps_for(main)[0])
                runs.append((f"crossbert-{size}-nocms{sfx}", "cms", off))
    return runs


# -----------------------------------------------------------------------------
# Running and probing


def by_layer(backbone, tasks, glue_dir, max_train, layers):
    """{layer: {"TASK/linear": %, "TASK/knn": %, ..., "linear_avg": %, "knn_avg": %}} of the frozen probes on each
    of `layers` (0 = the token embeddings, n_layer = the last), from one pass of the model over each task; glue_dir
    None: GLUE from the hub."""
    from probe import evaluate as probe_layers
    res = probe_layers(backbone, [load_task(t, glue_dir, max_train, 1337) for t in tasks], layers, verbose=False)
    out = {}
    for layer in layers:
        got = {f"{name}/{p}": r["layers"][layer][p]["score"] for name, r in res.items() for p in ("linear", "knn")}
        out[layer] = {**got, **{f"{p}_avg": float(np.mean([v for k, v in got.items() if k.endswith("/" + p)]))
                                for p in ("linear", "knn")}}
    return out


def evaluate(backbone, tasks, glue_tasks, glue_dir, sts, max_train, layers=False):
    """Frozen-probe scores of a backbone (features.Backbone): {"TASK/linear": %, "TASK/knn": %, ...}, the averages
    over the primary tasks (linear_avg, knn_avg) and over GLUE (glue_linear_avg, glue_knn_avg), and zero-shot STS
    (sts_zero_shot). With layers, also {layer: scores} of the primary tasks at every layer; the last layer's are the
    scores above."""
    from embeddings.vectors import zero_shot_sts
    n_layer = backbone.config.n_layer
    every = by_layer(backbone, tasks, glue_dir, max_train, list(range(n_layer + 1)) if layers else [n_layer])
    scores = dict(every[n_layer])
    if glue_tasks:
        scores.update({f"glue_{k}" if k.endswith("_avg") else k: v
                       for k, v in by_layer(backbone, glue_tasks, glue_dir, max_train, [n_layer])[n_layer].items()})
    if sts:
        scores["sts_zero_shot"] = zero_shot_sts(backbone, sts)
    return (scores, every) if layers else scores


# -----------------------------------------------------------------------------
# Command line


def read_plan(argv):
    """The command line's settings, checked (with the preset's values for those left at 0 or ""), the preset with
    its overrides, and the plan."""
    s = configure(settings, argv, help_from=[__file__])
    if s["preset"] not in PRESETS:
        raise UserError(f"--preset={s['preset']!r}: expected one of {', '.join(PRESETS)}")
    p = dict(PRESETS[s["preset"]])
    at_least(s, 0, ("nproc", "micro_batch", "seeds"), " (0 = the preset's)")
    at_least(s, 0, ("random_seeds",))
    check_device(s["device"])
    p.update(nproc=s["nproc"] or p["nproc"], micro_batch=s["micro_batch"] or p["micro_batch"])
    s.update(seeds=s["seeds"] or p.get("seeds", 1), out_dir=s["out_dir"] or f"sweep-{s['preset']}",
             axes=s["axes"] or p["axes"])
    families = read_families(s["families"] or p.get("families", ",".join(MODELS)))
    unknown = [a for a in s["axes"].split(",") if a not in ("main", "mask", "cms", "predictor", "lr", "replace")]
    if unknown:  # an axis spelled wrong would leave it out of the plan, silently
        raise UserError(f"--axes: unknown {', '.join(unknown)}; expected a comma-separated subset of "
                        "main,mask,cms,predictor,lr,replace")
    lr_scales = read_lr_scales(s["lr_scales"], "0.5,2") if s["lr_scales"] else []
    budgets = None
    if s["budgets"]:
        everything = [short(size_budget(p, i)) for i in range(len(p["sizes"]))]
        try:
            budgets = {short(float(b)) for b in s["budgets"].split(",")}
        except ValueError:
            raise UserError(f"--budgets={s['budgets']}: expected comma-separated FLOP counts, e.g. "
                            "--budgets=2.7e14") from None
        unknown = sorted(budgets - set(everything), key=float)
        if unknown:
            raise UserError(f"--budgets: {', '.join(unknown)} not in preset {s['preset']}; its budgets are "
                            f"{','.join(dict.fromkeys(everything))}")
    return s, p, plan(p, s["axes"].split(","), families, s["seeds"], budgets, lr_scales)


def show_plan(s, p, runs):
    """Print each run: parameters, FLOP budget, steps x batch (and its split), learning rate, estimated time."""
    print(f"preset {s['preset']}: {len(runs)} runs on {p['dataset']}, {p['nproc']} process(es) each, "
          f"into {s['out_dir']}/")
    corpus = os.path.join(ROOT, "data", p["dataset"], "train.bin")
    corpus_tokens = os.path.getsize(corpus) // 2 if os.path.exists(corpus) else 0
    total_flops = total_s = 0
    for name, axis, rs in runs:
        steps, per_step = steps_for(rs)
        snapshot_s = (p.get("snapshots", 1) - 1) * p.get("snapshot_probe_s", 0) if axis == "main" else 0
        est = steps * (per_step / p["flops_per_s"] + p["step_s"]) + p["overhead_s"] + snapshot_s
        total_flops, total_s = total_flops + steps * per_step, total_s + est
        params, body = param_counts(make_config(rs), rs["model_type"])
        tokens = steps * rs["total_batch_size"]
        epochs = f", {tokens / corpus_tokens:.1f} epochs" if corpus_tokens else ""
        print(f"  {name:26s} {axis:9s} {params / 1e6:7.2f}M params ({body / 1e6:.2f}M without the embedding)  "
              f"budget {rs['max_flops'] or steps * per_step:.2e} FLOPs = {steps:6d} steps x "
              f"{rs['total_batch_size']:7d} tokens ({p['nproc']} x {accumulation(rs, p['nproc'])} x "
              f"{rs['batch_size']} rows) = {tokens / 1e6:.1f}M input tokens ({tokens / params:.1f} per parameter, "
              f"{tokens / body:.1f} per non-embedding one{epochs})  lr {rs['learning_rate']:.2e}  ~{est / 60:.1f} min")
    print("  (a step's rows: processes x micro-steps x rows per micro-step; input tokens, not view positions)")
    snapshots = (f", and {p['snapshots'] - 1} snapshots probed at every layer, {p['snapshot_probe_s']} s each"
                 if p.get("snapshots") else "")
    print(f"total {total_flops:.2e} training FLOPs, about {total_s / 60:.0f} minutes on this preset's hardware "
          f"({p['flops_per_s']:.1e} FLOP/s achieved, {p['step_s']} s per step and {p['overhead_s']} s per run on top"
          f"{snapshots})")


def read_tasks(s, p):
    """(tasks, GLUE tasks, GLUE's folder or None for the hub) of the probes, every task read now and every other input
    and the output folder checked, so that bad input stops the sweep before its first run, not after it."""
    if not s["tasks"]:
        raise UserError("--tasks is needed: the task folders (train.tsv, dev.tsv) the primary average is taken over, "
                        "or a folder of them, e.g. --tasks=DIR/devtasks")
    if s["glue_tasks"] and not s["glue_dir"]:
        raise UserError("--glue_dir is needed for --glue_tasks: pass GLUE's task folders, e.g. --glue_dir=DIR/glue, "
                        "or --glue_dir=hub to load GLUE from the hub, or --glue_tasks= to skip GLUE")
    glue_dir = None if s["glue_dir"] in ("", "hub") else s["glue_dir"]
    if glue_dir and not os.path.isdir(glue_dir):
        raise UserError(f"--glue_dir={glue_dir} is not a folder; pass a GLUE folder (TASK/train.tsv, dev.tsv), "
                        "or --glue_dir=hub to load GLUE from the hub, or --glue_tasks= to skip GLUE")
    if s["sts"] and not os.path.exists(s["sts"]):
        raise UserError(f"--sts={s['sts']} does not exist; pass STS-B's folder, or --sts= (empty) to skip "
                        "zero-shot STS")
    tasks, glue_tasks = task_list(s["tasks"]), task_list(s["glue_tasks"])
    if not tasks:
        raise UserError(f"--tasks={s['tasks']}: no task folders there; pass folders of train.tsv and dev.tsv")
    check_writable(s["out_dir"], "--out_dir")
    if p["dataset"] != "tinybooks" and not os.path.exists(os.path.join(ROOT, "data", p["dataset"], "val.bin")):
        raise UserError(f"data/{p['dataset']} is not prepared; prepare it first, e.g. python data/local/prepare.py "
                        f"--input=DIR/{p['dataset']} --out_dir=data/{p['dataset']} (or a data/<corpus>/prepare.py)")
    for option, names in (("--tasks", tasks), ("--glue_tasks", glue_tasks)):
        try:
            for task in names:
                load_task(task, glue_dir, p["probe_max_train"])
        except UserError as e:
            raise UserError(f"{option}: {e}") from None
    return tasks, glue_tasks, glue_dir


def main(argv):
    s, p, runs = read_plan(argv)
    show_plan(s, p, runs)
    if s["dry_run"]:
        return
    tasks, glue_tasks, glue_dir = read_tasks(s, p)
    out_dir = s["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    results_path = os.path.join(out_dir, "results.jsonl")
    results = []
    if os.path.exists(results_path):
        with open(results_path) as f:
            results = [json.loads(line) for line in f]
    done, on_record, written = {r["name"] for r in results}, len(results), []
    try:  # the plots are an optional extra: the sweep runs and records without them
        optional("matplotlib", "drawing the sweep's plots")
        draw = plots
    except UserError as e:
        print(f"sweep: {e}; skipping them", file=sys.stderr)
        draw = lambda results, out_dir: []

    def record(r):  # every run is kept as it finishes, the table and plots follow: a sweep stopped part way has all
        results.append(r)
        done.add(r["name"])
        with open(results_path, "a") as f:
            f.write(json.dumps(r) + "\n")
        write_markdown(results, out_dir)
        written[:] = draw(results, out_dir)

    along = bool(p.get("snapshots"))  # probes along training and across layers (the ladder)
    score = lambda b: evaluate(b, tasks, glue_tasks, glue_dir, s["sts"], p["probe_max_train"], along)
    extra = {k: v for k, v in (("dtype", p["dtype"]), ("eval_interval", p["eval_interval"]),
                               ("snapshots", p.get("snapshots"))) if v}
    def layered(backbone):  # {"scores": ..., and with `along` "layers": {layer: scores}}; json keys are strings
        got = score(backbone)
        return dict(scores=got[0], layers={str(k): v for k, v in got[1].items()}) if along else dict(scores=got)

    unmade = set()  # twins no run's checkpoint here could make yet
    for name, axis, rs in runs:
        run_dir = os.path.join(out_dir, name)
        shape = f"{rs['n_layer']}x{rs['n_embd']}"
        backbone = None  # this run's checkpoint, loaded once for its probes and its random twins
        if name not in done:
            t0 = time.time()
            print(f"sweep: training {name} ...", flush=True)
            try:
                train(name, {**rs, **extra}, run_dir, p["nproc"], s["compile"])
            except RunFailed as e:  # what finished is on record, and a run cut short resumes from its checkpoint
                sys.exit(f"sweep.py: {e}, then rerun the same command to continue the sweep")
            t1 = time.time()
            scale = {}  # the lr axis's multiple of the power law's learning rate at the run's budget
            if axis in ("lr", "replace"):
                law = run_settings(p, rs["n_layer"], rs["n_embd"], rs["n_head"], rs["model_type"], rs["max_flops"])
                scale = dict(lr_scale=round(rs["learning_rate"] / law["learning_rate"], 4))
            r, backbone = run_record(name, axis, rs, run_dir, s["device"], **scale)
            r.update(layered(backbone))
            if along:
                every = list(range(backbone.config.n_layer + 1))
                r["trajectory"] = trajectory(run_dir, s["device"], lambda b: {str(k): v for k, v in by_layer(
                    b, tasks, glue_dir, p["probe_max_train"], every).items()})
            r.update(train_s=round(t1 - t0, 1), probe_s=round(time.time() - t1, 1))
            record(r)
            print(f"sweep: {name}: val loss {r['val_loss']:.3f} (unigram {r['unigram_loss']:.3f}), "
                  f"linear {r['scores']['linear_avg']:.1f}, kNN {r['scores']['knn_avg']:.1f} "
                  f"[{r['train_s']:.0f} s training, {r['probe_s']:.0f} s probing]", flush=True)
        # random twins of this family and shape: twin k holds training seed k's initial weights (the same seed and
        # construction as train.py), so trained minus twin is what training did to that init; shared by every budget
        for k in range(max(s["seeds"], s["random_seeds"]) if axis == "main" else 0):
            twin = f"random-{rs['model_type']}-{shape}" + (f"-s{k}" if k else "")
            if twin in done:
                continue
            if backbone is None:
                ckpt_path = os.path.join(run_dir, "ckpt.pt")
                if not os.path.exists(ckpt_path):
                    # the run is on record from a copied results.jsonl; a twin needs only the shape and the vocabulary
                    # map, so a later run of its family and shape with a checkpoint here (one this call trains) makes it
                    unmade.add(twin)
                    continue
                backbone, _ = load_backbone(ckpt_path, s["device"])
            r = dict(twin_record(rs, k, backbone), **layered(random_twin(backbone, 1337 + k)))
            record(r)
            print(f"sweep: {twin}: linear {r['scores']['linear_avg']:.1f}, kNN {r['scores']['knn_avg']:.1f}",
                  flush=True)

    if unmade - done:
        print(f"sweep: {', '.join(sorted(unmade - done))} not made: no run of that family and shape has a checkpoint "
              f"in {out_dir} (they are on record from elsewhere); train one here, or run the sweep in their folder",
              file=sys.stderr)
    write_markdown(results, out_dir)
    if len(results) == on_record:  # nothing finished in this call (a finished sweep run again): plot what is on record
        written = draw(results, out_dir)
    print(summarize(results))
    print(f"sweep: wrote {out_dir}/results.jsonl, results.md" + "".join(f", {w}" for w in written))


if __name__ == "__main__":
    with user_errors("sweep.py"):
        main(sys.argv[1:])
