"""
Frozen evaluation: how usable are a backbone's features to simple probes?

- Features: each sentence (or pair, encoded as `a <|endoftext|> b`) is the mean of its last-layer states over its
  real tokens; --layers reads any layer (the final norm on each, so all are on one scale; 0: the token embeddings).
- linear: closed-form ridge regression on standardised features onto one-hot targets (or the score, for STS-B).
- kNN: a similarity-weighted vote of the k nearest train examples by cosine (their scores' weighted mean, for STS-B).
- λ and k are picked on a held-out part of train; dev is scored with each task's GLUE metric.

    python probe.py --ckpt=out/ckpt.pt --glue_dir=DIR/glue --tasks=SST-2,CoLA,MRPC,STS-B,RTE,WNLI
    python probe.py --ckpt=random --like=out/ckpt.pt --glue_dir=DIR/glue   # its random twin: the baseline
    python probe.py --ckpt=out/ckpt.pt --layers=all --out=probe.json      # layer-wise table
    python probe.py --tasks=path/to/my_task                                # your own train.tsv/dev.tsv

Without --glue_dir, GLUE comes from the hub (nyu-mll/glue). train.py (probe_tasks) and experiments/ call the probes.
"""
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from configurator import UserError, configure, user_errors
from data.tasks import GLUE, load_task
from plumbing.checks import at_least, check_writable
import evaluation.features as features_module
from evaluation.features import MODEL_SETTINGS, check_model_settings, features, load_model, tokenize
from evaluation.metrics import METRICS

settings = dict(
    **MODEL_SETTINGS,
    tasks=",".join(GLUE),   # comma-separated GLUE names, or folders of train.tsv and dev.tsv
    glue_dir="",            # GLUE in the official layout PATH/<TASK>/*.tsv; "" = from the hub
    layers="last",          # last, all, or comma-separated layer numbers (0: the embeddings, 1..n_layer: the blocks)
    max_train=0,            # keep a seeded random subset of this many train examples of each task (0: all)
    batch_size=64,          # sequences per forward pass
    out="",                 # write every score, λ, k, count and timing to this JSON file
)

LAMBDAS = 10.0 ** np.arange(-5, 2.01, 0.5)  # ridge penalty per training example (features have unit variance)
KS = (1, 3, 5, 10, 20, 50, 100)
TAU = 0.07      # kNN vote weight exp(similarity / TAU), as in instance-discrimination kNN (our choice)
VAL_FRAC = 0.2  # part of train held out to pick λ and k


# ----------------------------------------------------------------------------
# Probes

def standardise(X, *others):
    """X and others scaled by X's per-feature mean and standard deviation."""
    mean, std = X.mean(0), X.std(0) + 1e-6
    return [(A - mean) / std for A in (X, *others)]


def ridge(X, Y, Xq, lams):
    """Predictions on Xq of the ridge fit of Y on X for every λ in lams, from one eigendecomposition.

    Each fit minimises mean_i |y_i - b - W x_i|^2 + λ |W|^2; the intercept b is not penalised,
    which centring X and Y on their means does. With X'X = V diag(s) V' the solution is
    W = V diag(1 / (s + nλ)) V'X'Y, so every λ costs two small matmuls. When there are fewer
    examples than features the Gram matrix XX' = U diag(s) U' is the smaller one, and
    W = X'U diag(1 / (s + nλ)) U'Y.
    """
    X, Y, Xq = (np.asarray(A, np.float64) for A in (X, Y, Xq))
    n, d = X.shape
    mx, my = X.mean(0), Y.mean(0)
    X, Y, Xq = X - mx, Y - my, Xq - mx
    if d <= n:
        s, V = np.linalg.eigh(X.T @ X)
        P, B = Xq @ V, V.T @ (X.T @ Y)
    else:
        s, U = np.linalg.eigh(X @ X.T)
        P, B = Xq @ X.T @ U, U.T @ Y
    s = np.clip(s, 0, None)  # roundoff can make the smallest eigenvalues slightly negative
    return [P @ (B / (s + n * lam)[:, None]) + my for lam in lams]


def knn(X, y, Xq, ks, n_classes=None, device="cpu"):
    """kNN predictions on Xq for every k in ks, by cosine similarity to the rows of X.

    Neighbours vote with weight exp(similarity / TAU): class votes (argmax) for classification,
    the weighted mean of their targets when n_classes is None (regression).
    """
    X = F.normalize(torch.as_tensor(X, dtype=torch.float32, device=device), dim=1)
    Q = F.normalize(torch.as_tensor(Xq, dtype=torch.float32, device=device), dim=1)
    y = torch.as_tensor(y, device=device)
    # regression: a column of ones rides along, so its vote is the sum of the weights
    Y = F.one_hot(y, n_classes).float() if n_classes else torch.stack([y.float(), torch.ones_like(y).float()], 1)
    kmax = min(max(ks), len(X))
    preds = [[] for _ in ks]
    step = max(1, 2 ** 24 // len(X))  # queries per chunk: a (step, n) similarity matrix of 64 MB at most
    for i in range(0, len(Q), step):
        sim, nearest = (Q[i:i + step] @ X.T).topk(kmax, dim=1)
        votes = (torch.exp(sim / TAU)[..., None] * Y[nearest]).cumsum(1)  # votes of the nearest 1..kmax
        for j, k in enumerate(ks):
            v = votes[:, min(k, kmax) - 1]
            preds[j].append(v.argmax(1) if n_classes else v[:, 0] / v[:, 1])
    return [torch.cat(p).cpu().numpy() for p in preds]


def score(pred, gold, metrics):
    """(mean of the task's metrics, {metric: value}), in percent; GLUE averages MRPC's and STS-B's two."""
    values = {m: 100 * METRICS[m](pred, gold) for m in metrics}
    return float(np.mean(list(values.values()))), values

# ----------------------------------------------------------------------------
# Probing one feature set

def probe(Ftr, ytr, Fdev, ydev, classes, metrics, seed=1337, device="cpu"):
    """Linear and kNN probe scores on dev, with λ and k chosen on a held-out part of train."""
    n_classes = len(classes) if classes else None
    perm = np.random.default_rng(seed).permutation(len(Ftr))
    val, fit = np.split(perm, [max(1, int(VAL_FRAC * len(Ftr)))])
    Xfit, Xval = standardise(Ftr[fit], Ftr[val])
    Xtr, Xdev = standardise(Ftr, Fdev)
    Y = np.eye(n_classes)[ytr] if n_classes else ytr[:, None]  # one-hot: one-vs-rest targets
    decode = (lambda P: P.argmax(1)) if n_classes else (lambda P: P[:, 0])
    best = lambda preds: int(np.argmax([score(p, ytr[val], metrics)[0] for p in preds]))
    # once λ and k are chosen, the probes are refitted on all of train (our choice)
    lam = LAMBDAS[best([decode(P) for P in ridge(Xfit, Y[fit], Xval, LAMBDAS)])]
    linear, linear_metrics = score(decode(ridge(Xtr, Y, Xdev, [lam])[0]), ydev, metrics)
    # kNN on the standardised features too (our choice): in raw pooled states a few large, nearly
    # constant dimensions would dominate every cosine
    ks = [k for k in KS if k <= len(fit)]
    k = ks[best(knn(Xfit, ytr[fit], Xval, ks, n_classes, device))]
    knn_score, knn_metrics = score(knn(Xtr, ytr, Xdev, [k], n_classes, device)[0], ydev, metrics)
    return dict(dim=Ftr.shape[1], linear=dict(score=linear, metrics=linear_metrics, lam=float(lam)),
                knn=dict(score=knn_score, metrics=knn_metrics, k=k))


def evaluate(model, tasks, layers, batch_size=64, seed=1337, verbose=True):
    """{task name: counts, timing and, per layer, the probe() results} for tasks from load_task()."""
    device = next(model.parameters()).device
    results = {}
    for task in tasks:
        t0 = time.time()
        feats, n_truncated = {}, 0
        for split in ("train", "dev"):
            ids, n = tokenize(task[split][0], model.config.block_size)
            feats[split] = features(model, ids, layers, batch_size, desc=verbose and f"{task['name']} {split}")
            n_truncated += n
        t1 = time.time()
        per_layer = {layer: probe(feats["train"][layer], task["train"][1], feats["dev"][layer], task["dev"][1],
                                  task["classes"], task["metrics"], seed, device) for layer in layers}
        results[task["name"]] = dict(metrics=task["metrics"], classes=task["classes"], n_train=len(task["train"][1]),
                                     n_dev=len(task["dev"][1]), n_truncated=n_truncated, layers=per_layer,
                                     time_features_s=round(t1 - t0, 2), time_probes_s=round(time.time() - t1, 2))
    return results


def probe_tasks(model, tasks, glue_dir=None, max_train=2000, batch_size=64, seed=1337):
    """Last-layer probe scores {"<task>/linear": %, "<task>/knn": %}: train.py's monitor during training. tasks: a list
    of names or a comma-separated string; pass the bare model (not DDP or compiled); its train/eval mode is restored."""
    tasks = tasks.split(",") if isinstance(tasks, str) else tasks
    last = model.config.n_layer
    res = evaluate(model, [load_task(t, glue_dir, max_train, seed) for t in tasks], [last], batch_size, seed,
                   verbose=False)
    return {f"{name}/{p}": r["layers"][last][p]["score"] for name, r in res.items() for p in ("linear", "knn")}

# ----------------------------------------------------------------------------
# Command line

def parse_layers(spec, n_layer):
    if spec in ("last", "all"):
        return [n_layer] if spec == "last" else list(range(n_layer + 1))
    layers = [int(x) for x in spec.split(",") if x.isdigit()]
    if len(layers) != len(spec.split(",")) or not all(0 <= x <= n_layer for x in layers):
        raise UserError(f"--layers={spec}: use last, all, or layer numbers in 0..{n_layer}, 0 being the embeddings "
                        f"(e.g. 0,{n_layer})")
    return layers


def table(results, layers, averages):
    """The markdown table: a row per task and layer, then each layer's average."""
    fmt = lambda s, ms: f"{s:.1f}" if len(ms) == 1 else f"{s:.1f} ({'/'.join(f'{v:.1f}' for v in ms.values())})"
    lines = ["| layer | task | metric | n_train | n_dev | linear | λ | kNN | k |", "|---" * 9 + "|"]
    for layer in layers:
        for name, r in results.items():
            p = r["layers"][layer]
            lines.append(f"| {layer} | {name} | {'/'.join(r['metrics'])} | {r['n_train']} | {r['n_dev']} "
                         f"| {fmt(p['linear']['score'], p['linear']['metrics'])} | {p['linear']['lam']:.2g} "
                         f"| {fmt(p['knn']['score'], p['knn']['metrics'])} | {p['knn']['k']} |")
        avg = averages[layer]
        lines.append(f"| {layer} | **average** | | | | **{avg['linear']:.1f}** | | **{avg['knn']:.1f}** | |")
    return "\n".join(lines)


def main(argv=None):
    # --help: this docstring, and each setting's comment, here or (the backbone's) in evaluation/features.py
    s = configure(settings, argv, help_from=[__file__, features_module.__file__])
    with user_errors("probe.py"):
        check_model_settings(s)
        at_least(s, 1, ("batch_size",))
        if s["out"]:
            check_writable(s["out"], "--out", folder=False)
        run(s)


def run(s):
    t0 = time.time()
    # all data first, so that bad input fails before any model is loaded
    tasks = [load_task(t, s["glue_dir"] or None, s["max_train"], s["seed"]) for t in s["tasks"].split(",")]
    model, info = load_model(s)
    layers = parse_layers(s["layers"], model.config.n_layer)
    results = evaluate(model, tasks, layers, s["batch_size"], s["seed"])
    averages = {layer: {p: float(np.mean([r["layers"][layer][p]["score"] for r in results.values()]))
                        for p in ("linear", "knn")} for layer in layers}
    print(f"{info['ckpt']}: {info['model_type']}, {model.config.n_layer} layers x {model.config.n_embd}"
          + (f", step {info['step']}" if info.get("step") is not None else "") + "\n")
    print(table(results, layers, averages))
    notes = [f"{n} {r['n_truncated']}" for n, r in results.items() if r["n_truncated"]]
    print(f"\nsequences truncated to block_size {model.config.block_size}: {', '.join(notes) or 'none'}")
    regression = [n for n, r in results.items() if r["classes"] is None]
    if regression:
        print(f"{', '.join(regression)}: regression; the linear probe fits the score, "
              "kNN takes the weighted mean of the neighbours' scores")
    elapsed = time.time() - t0
    print(f"wall time {elapsed:.0f} s")
    if s["out"]:
        with open(s["out"], "w") as f:
            json.dump(dict(**info, layers=layers, tasks=results, average=averages, args=s, time_s=elapsed), f, indent=1)


if __name__ == "__main__":
    main()
