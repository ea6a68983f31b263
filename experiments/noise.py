"""
The instrument's noise: how far the probe averages move when nothing but a seed changes, and so how large a
difference between two models the instrument can detect.

    python experiments/noise.py --like=out/ckpt.pt --tasks=../shared/devtasks              # init and probe seeds
    python experiments/noise.py --like=out/ckpt.pt --trained=a/ckpt.pt,b/ckpt.pt,c/ckpt.pt # + training seeds

Three sources, each varied alone: the random init (random twins of --like, seeds 1337, 1338, ...), the probe's
seed (which max_train examples are kept and which part of them picks λ and k), and, with --trained, the training
seed (checkpoints that differ only in their seed). For each, the standard deviation of the linear and kNN averages
over the tasks, and the smallest difference between the means of two groups of n seeds that a two-sided 95% t-test
would call real: t(2n - 2) x sd x sqrt(2 / n), with sd the largest of the sources measured.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from checkpoint import load_checkpoint
from errors import UserError, check_writable, fail, user_errors
from data.tasks import load_task, task_list
from features import features, random_twin, tokenize
from probe import probe
from stats import t95


def averages(model, tasks, seed):
    """(linear, kNN) averages over tasks (dicts from load_task, with their ids tokenized)."""
    device = next(model.parameters()).device
    scores = []
    for t in tasks:
        f = {s: features(model, t["ids"][s])[model.config.n_layer] for s in ("train", "dev")}
        r = probe(f["train"], t["train"][1], f["dev"], t["dev"][1], t["classes"], t["metrics"], seed, device)
        scores.append((r["linear"]["score"], r["knn"]["score"]))
    return tuple(float(x) for x in np.mean(scores, axis=0))


def main(argv=None):
    p = argparse.ArgumentParser(description="How much the probe averages move with the init, probe and training seed.")
    p.add_argument("--like", required=True, help="a checkpoint: its random twins give the init seeds' spread")
    p.add_argument("--trained", default="", help="comma-separated checkpoints that differ only in their training seed")
    p.add_argument("--tasks", default="../shared/devtasks", help="task folders, or a folder of them")
    p.add_argument("--max_train", type=int, default=2000)
    p.add_argument("--init_seeds", type=int, default=5)
    p.add_argument("--probe_seeds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="", help="also write every score to this JSON file")
    args = p.parse_args(argv)
    if args.init_seeds < 2 or args.probe_seeds < 2:
        fail("--init_seeds and --probe_seeds: at least 2 each, or there is no spread to measure", "noise.py")
    if args.out:
        check_writable(args.out, "--out", folder=False)
    try:
        like, _ = load_checkpoint(args.like, args.device)
        trained = [load_checkpoint(c, args.device)[0] for c in filter(None, args.trained.split(","))]
    except ValueError as e:  # a missing, truncated or foreign checkpoint
        raise UserError(str(e)) from None
    names = task_list(args.tasks)
    block = like.config.block_size

    def tasks_for(seed):  # the probe seed picks the kept training examples too
        out = [load_task(n, max_train=args.max_train, seed=seed) for n in names]
        for t in out:
            t["ids"] = {s: tokenize(t[s][0], block)[0] for s in ("train", "dev")}
        return out

    base = tasks_for(1337)
    runs = {"init": [averages(random_twin(like, 1337 + k), base, 1337) for k in range(args.init_seeds)],
            "probe": [averages(random_twin(like, 1337), tasks_for(1337 + k), 1337 + k) for k in range(args.probe_seeds)]}
    if trained:
        runs["training"] = [averages(m, base, 1337) for m in trained]
    print(f"{len(names)} tasks, max_train {args.max_train}; linear / kNN averages\n")
    print("| source | seeds | linear: mean ± sd | kNN: mean ± sd |\n|---|---|---|---|")
    sd = {}
    for source, xs in runs.items():
        xs = np.array(xs)
        sd[source] = xs.std(axis=0, ddof=1) if len(xs) > 1 else np.zeros(2)
        print(f"| {source} | {len(xs)} | {xs[:, 0].mean():.2f} ± {sd[source][0]:.2f} | "
              f"{xs[:, 1].mean():.2f} ± {sd[source][1]:.2f} |")
    worst = np.max(list(sd.values()), axis=0)
    print("\nSmallest difference of two means of n seeds each that a two-sided 95% t-test detects "
          "(the largest sd above):\n\n| n | linear | kNN |\n|---|---|---|")
    for n in (1, 3, 5):
        t = t95(2 * n - 2) if n > 1 else None
        cells = [f"{t * s * math.sqrt(2 / n):.2f}" if t else "no test with one seed" for s in worst]
        print(f"| {n} | {cells[0]} | {cells[1]} |")
    if args.out:  # written whole, then renamed, into a folder made if needed
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(dict(vars(args), runs=runs, sd={k: v.tolist() for k, v in sd.items()}), f, indent=1)
        os.replace(args.out + ".tmp", args.out)


if __name__ == "__main__":
    with user_errors("noise.py"):
        main(sys.argv[1:])
