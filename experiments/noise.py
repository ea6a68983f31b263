"""
The instrument's noise: how far the probe averages move when nothing but a seed changes, and so how large a
difference between two models the instrument can detect.

    python experiments/noise.py --like=out/ckpt.pt --tasks=DIR/devtasks                        # init and probe seeds
    python experiments/noise.py --like=out/ckpt.pt --tasks=DIR/devtasks --trained=a/ckpt.pt,b/ckpt.pt  # + training

Three sources, each varied alone: the random init (random twins of --like, seeds 1337, 1338, ...), the probe's
seed (which max_train examples are kept and which part of them picks λ and k), and, with --trained, the training
seed (checkpoints that differ only in their seed). For each, the standard deviation of the linear and kNN averages
over the tasks, and the smallest difference between the means of two groups of n seeds that a two-sided 95% t-test
would call real: t(2n - 2) x sd x sqrt(2 / n), with sd the largest of the sources measured.
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from configurator import UserError, configure, user_errors
from plumbing.checks import check_device, check_writable
from data.tasks import load_task, task_list
from evaluation.features import features, load_backbone, random_twin, tokenize
from probe import probe
from stats import t95

settings = dict(
    like="",                  # a checkpoint (required): its random twins give the init seeds' spread
    trained="",               # comma-separated checkpoints that differ only in their training seed
    tasks="",                 # task folders, or a folder of them (needed), e.g. DIR/devtasks
    max_train=2000,           # training examples per task for the probes (a seeded subset)
    init_seeds=5,             # random twins of --like: seeds 1337, 1338, ...
    probe_seeds=3,            # probe seeds: which max_train examples are kept, and which of them pick λ and k
    device="cpu",             # where the models run: cpu, cuda or cuda:N
    out="",                   # also write every score to this JSON file
)


def averages(backbone, tasks, seed):
    """(linear, kNN) averages over tasks (dicts from load_task, with their ids tokenized) of a features.Backbone."""
    device = next(backbone.parameters()).device
    scores = []
    for t in tasks:
        f = {s: features(backbone, t["ids"][s])[backbone.config.n_layer] for s in ("train", "dev")}
        r = probe(f["train"], t["train"][1], f["dev"], t["dev"][1], t["classes"], t["metrics"], seed, device)
        scores.append((r["linear"]["score"], r["knn"]["score"]))
    return tuple(float(x) for x in np.mean(scores, axis=0))


def main(argv):
    s = configure(settings, argv, help_from=[__file__])
    if not s["like"]:
        raise UserError("--like: pass a checkpoint; its random twins give the init seeds' spread")
    if s["init_seeds"] < 2 or s["probe_seeds"] < 2:
        raise UserError("--init_seeds and --probe_seeds: at least 2 each, or there is no spread to measure")
    check_device(s["device"])
    if not s["tasks"]:
        raise UserError("--tasks is needed: the task folders (train.tsv, dev.tsv) to probe, or a folder of them, e.g. "
                        "--tasks=DIR/devtasks")
    if s["out"]:
        check_writable(s["out"], "--out", folder=False)
    like, _ = load_backbone(s["like"], s["device"])
    trained = [load_backbone(c, s["device"])[0] for c in filter(None, s["trained"].split(","))]
    names = task_list(s["tasks"])
    block = like.config.block_size

    def tasks_for(seed):  # the probe seed picks the kept training examples too
        out = [load_task(n, max_train=s["max_train"], seed=seed) for n in names]
        for t in out:
            t["ids"] = {split: tokenize(t[split][0], block)[0] for split in ("train", "dev")}
        return out

    base = tasks_for(1337)
    runs = {"init": [averages(random_twin(like, 1337 + k), base, 1337) for k in range(s["init_seeds"])],
            "probe": [averages(random_twin(like, 1337), tasks_for(1337 + k), 1337 + k)
                      for k in range(s["probe_seeds"])]}
    if trained:
        runs["training"] = [averages(m, base, 1337) for m in trained]
    print(f"{len(names)} tasks, max_train {s['max_train']}; linear / kNN averages\n")
    print("| source | seeds | linear: mean ± sd | kNN: mean ± sd |\n|---|---|---|---|")
    sds = {}
    for source, xs in runs.items():
        xs = np.array(xs)
        sds[source] = xs.std(axis=0, ddof=1) if len(xs) > 1 else np.zeros(2)
        print(f"| {source} | {len(xs)} | {xs[:, 0].mean():.2f} ± {sds[source][0]:.2f} | "
              f"{xs[:, 1].mean():.2f} ± {sds[source][1]:.2f} |")
    worst = np.max(list(sds.values()), axis=0)
    print("\nSmallest difference of two means of n seeds each that a two-sided 95% t-test detects "
          "(the largest sd above):\n\n| n | linear | kNN |\n|---|---|---|")
    for n in (1, 3, 5):
        t = t95(2 * n - 2) if n > 1 else None
        cells = [f"{t * sd * math.sqrt(2 / n):.2f}" if t else "no test with one seed" for sd in worst]
        print(f"| {n} | {cells[0]} | {cells[1]} |")
    if s["out"]:  # written whole, then renamed, into a folder made if needed
        os.makedirs(os.path.dirname(os.path.abspath(s["out"])), exist_ok=True)
        with open(s["out"] + ".tmp", "w") as f:
            json.dump(dict(s, runs=runs, sd={k: v.tolist() for k, v in sds.items()}), f, indent=1)
        os.replace(s["out"] + ".tmp", s["out"])


if __name__ == "__main__":
    with user_errors("noise.py"):
        main(sys.argv[1:])
