"""
The block's ablation: which parts of a modern flat encoder (HF ModernBERT) make our BERT's frozen features as good
as its, one factor at a time, with seeds; and each family on the chosen block against the peer.

Every run is the sweep's smallest BERT cell (4 x 256, block 128, compact vocabulary of 8,192 ids, 2,048 input
tokens a step, 721 steps, lr 1.2956e-3 warmup 36 cosine to a tenth; CrossBERT and ELECTRA take as many steps as
fit in BERT's FLOPs), then a frozen probe of the trained encoder and of its random twin (the same seed's initial
weights) on the devtasks. The peer is ../shared/bench/peer_train.py (needs transformers) on the same windows,
vocabulary map, masks, steps and schedule.

    python experiments/block.py --runs=old,new,peer --seeds=3 --corpus=web     # trains what is missing, records each
    python experiments/block.py --table                                         # the tables, from results.jsonl

Runs (--runs): old (the block before: GELU MLP, no embedding norm, no prediction head, no decoder bias), new (the
defaults), old+X (the old block with one part of the new: geglu, emb_norm, lm_head, decoder_bias), new-X (the new
block without one), crossbert and electra (on the new block, at BERT's FLOPs), peer (ModernBERT).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from configurator import UserError, configure, user_errors
from plumbing.checks import at_least, check_writable
from runs import RunFailed, read_log, train
from stats import fmt

settings = dict(
    runs="old,new,peer",      # comma-separated run names (see above)
    seeds=3,                  # seeds 1337, 1338, ... of each run
    corpus="web",             # a folder under data/ holding train.bin and val.bin
    tasks=os.path.join(os.path.dirname(ROOT), "shared", "devtasks"),  # the probes' tasks: a folder of task folders
    max_train=2000,           # training examples per task for the probes (a seeded subset)
    work=os.path.join(ROOT, "sweep-block"),  # the runs' checkpoints and logs (not committed)
    results=os.path.join(ROOT, "experiments", "results", "block", "results.jsonl"),  # a record a run; results.md too
    table=False,              # only write the tables from the results
)

RECIPE = dict(model_type="bert", n_layer=4, n_head=4, n_embd=256, block_size=128, vocab_size=8192, max_iters=721,
              learning_rate=1.2956e-3, min_lr=1.2956e-4, warmup_iters=36, total_batch_size=2048, batch_size=16,
              eval_interval=721, log_interval=100)
OLD = dict(mlp="gelu", emb_norm=False, lm_head=False, decoder_bias=False)
NEW = dict(mlp="geglu", emb_norm=True, lm_head=True, decoder_bias=True)
PARTS = ("geglu", "emb_norm", "lm_head", "decoder_bias")


def block_of(name):
    """The block settings of a run name: old, new, old+part or new-part (crossbert/electra: new)."""
    if name in ("old", "new", "crossbert", "electra"):
        return dict(OLD if name == "old" else NEW)
    base, sign, part = name.partition("+") if "+" in name else name.partition("-")
    if base not in ("old", "new") or part not in PARTS:
        raise UserError(f"--runs: unknown run {name!r}; expected old, new, old+PART, new-PART, crossbert, electra "
                         f"or peer, with PART one of {', '.join(PARTS)}")
    block = dict(OLD if base == "old" else NEW)
    on = sign == "+"
    block.update(mlp=("geglu" if on else "gelu")) if part == "geglu" else block.update({part: on})
    return block


def settings_of(name, corpus, seed):
    s = dict(RECIPE, dataset=os.path.join(ROOT, "data", corpus), seed=seed, **block_of(name))
    if name in ("crossbert", "electra"):  # as many steps as fit in BERT's FLOPs on the new block
        from flops import training_flops
        from model import make_config
        rows = s["total_batch_size"] // s["block_size"]
        bert = training_flops(make_config(dict(s, model_type="bert")), "bert", rows)
        s.pop("max_iters")
        s.update(model_type=name, max_flops=bert * RECIPE["max_iters"])
    return s


def probe_pair(ckpt, tasks):
    """Linear and kNN scores per task of a checkpoint's encoder and of its random twin (same seed's init), and the
    checkpoint's code."""
    from plumbing.checkpoint import load_checkpoint
    from evaluation.features import random_twin
    from probe import evaluate
    model, ck = load_checkpoint(ckpt)
    twin = random_twin(model, ck["config"]["seed"])
    out = {}
    for which, m in (("trained", model), ("twin", twin)):
        L = m.config.n_layer
        r = evaluate(m.eval(), tasks, [L], verbose=False)
        out[which] = {p: {t: v["layers"][L][p]["score"] for t, v in r.items()} for p in ("linear", "knn")}
    return dict(out, code=ck.get("code"))  # the code that trained it


def run_ours(name, corpus, seed, work, tasks):
    s = settings_of(name, corpus, seed)
    out_dir = os.path.join(work, f"{corpus}-{name}-{seed}")
    if not os.path.exists(os.path.join(out_dir, "done")):  # train() resumes a run cut short from its checkpoint
        t0 = time.time()
        train(f"{corpus}-{name}-{seed}", s, out_dir, 1, True)
        open(os.path.join(out_dir, "done"), "w").write(f"{time.time() - t0:.0f}\n")
    log = read_log(out_dir)
    head = log[0]
    val = [r for r in log if "val_loss" in r][-1]
    train_s = float(open(os.path.join(out_dir, "done")).read())
    rec = dict(run=name, corpus=corpus, seed=seed, val_loss=val["val_loss"], unigram=head["unigram_loss"],
               steps=head["max_iters"], flops_per_step=head["flops_per_step"], flops=val["flops"], train_s=train_s,
               block=block_of(name), model_type=s["model_type"])
    rec.update(probe_pair(os.path.join(out_dir, "ckpt.pt"), tasks))
    return rec


def run_peer(corpus, seed, work, tasks_dir):
    out = os.path.join(work, f"{corpus}-peer-{seed}.json")
    if not os.path.exists(out):
        subprocess.run([sys.executable, os.path.join(os.path.dirname(ROOT), "shared", "bench", "peer_train.py"),
                        "--arch=modernbert", f"--data={os.path.join(ROOT, 'data', corpus)}", f"--tasks={tasks_dir}",
                        "--steps=721", "--lr=1.2956e-3", "--warmup=36", f"--seed={seed}", f"--out={out}"],
                       check=True, cwd=ROOT)
    r = json.load(open(out))
    p = r["probes"]
    return dict(run="peer", corpus=corpus, seed=seed, val_loss=r["val_final"], unigram=None, steps=r["args"]["steps"],
                flops_per_step=None, flops=None, train_s=r["train_s"], block="HF ModernBERT", model_type="modernbert",
                trained={k: p["hf-modernbert-trained"][k] for k in ("linear", "knn")},
                twin={k: p["hf-modernbert-random"][k] for k in ("linear", "knn")})


def avg(scores):
    return float(np.mean(list(scores.values())))


def table(results):
    """Markdown: each run's val loss and probe averages against its twins, and each run against old and against the
    peer, paired by seed (95% t-intervals over the seeds both ran)."""
    lines = []
    for corpus in sorted({r["corpus"] for r in results}):
        rs = [r for r in results if r["corpus"] == corpus]
        by = {}
        for r in rs:
            by.setdefault(r["run"], {})[r["seed"]] = r
        uni = next((r["unigram"] for r in rs if r["unigram"]), None)
        lines += [f"### {corpus} (unigram baseline {uni:.3f} nats)" if uni else f"### {corpus}", "",
                  "| run | seeds | GFLOPs/step | val loss | linear | twins | trained − twin | kNN | twins | "
                  "trained − twin |", "|---" * 10 + "|"]
        for name, seeds in by.items():
            runs = list(seeds.values())
            cells = [name, str(len(runs)), f"{runs[0]['flops_per_step'] / 1e9:.1f}" if runs[0]["flops_per_step"] else "",
                     fmt([r["val_loss"] for r in runs], places=3)]
            for p in ("linear", "knn"):
                cells += [fmt([avg(r["trained"][p]) for r in runs]), fmt([avg(r["twin"][p]) for r in runs]),
                          fmt([avg(r["trained"][p]) - avg(r["twin"][p]) for r in runs], signed=True)]
            lines.append("| " + " | ".join(cells) + " |")
        pairs_table = ["", "Paired by seed (mean [95% interval]):", "",
                       "| comparison | seeds | val loss | linear | kNN |", "|---" * 5 + "|"]
        for base in ("old", "new", "peer"):
            for name, seeds in by.items():
                # against new: its ablations, and CrossBERT and ELECTRA, which are at the new BERT's FLOPs
                wanted = {"old": not name.startswith("new-") and name != "peer",
                          "new": name.startswith("new-") or name in ("crossbert", "electra"),
                          "peer": name in ("old", "new", "crossbert", "electra")}[base]
                if name == base or base not in by or not wanted:
                    continue
                common = sorted(set(seeds) & set(by[base]))
                if not common:
                    continue
                pairs = [(seeds[s], by[base][s]) for s in common]
                diff = lambda f, places=1: fmt([f(x) - f(y) for x, y in pairs], signed=True, places=places)
                pairs_table.append(f"| {name} − {base} | {len(common)} | {diff(lambda r: r['val_loss'], 3)} | "
                                   f"{diff(lambda r: avg(r['trained']['linear']))} | "
                                   f"{diff(lambda r: avg(r['trained']['knn']))} |")
        lines += (pairs_table if len(pairs_table) > 5 else []) + [""]
    return "\n".join(lines)


def main(argv):
    s = configure(settings, argv, help_from=[__file__])
    names = s["runs"].split(",")
    for name in names:  # every run name checked before the first run trains
        if name != "peer":
            block_of(name)
    at_least(s, 1, ("seeds",))
    check_writable(s["results"], "--results", folder=False)
    if not s["table"]:
        check_writable(s["work"], "--work")
        folders = sorted(os.path.join(s["tasks"], d) for d in os.listdir(s["tasks"])
                         if os.path.isdir(os.path.join(s["tasks"], d)))
    os.makedirs(os.path.dirname(os.path.abspath(s["results"])), exist_ok=True)
    results = [json.loads(line) for line in open(s["results"])] if os.path.exists(s["results"]) else []
    if not s["table"]:
        from data.tasks import load_task
        tasks = None
        for seed in range(1337, 1337 + s["seeds"]):
            for name in names:
                if any((r["run"], r["corpus"], r["seed"]) == (name, s["corpus"], seed) for r in results):
                    continue
                if name == "peer":
                    rec = run_peer(s["corpus"], seed, s["work"], s["tasks"])
                else:
                    tasks = tasks or [load_task(f, max_train=s["max_train"]) for f in folders]
                    try:
                        rec = run_ours(name, s["corpus"], seed, s["work"], tasks)
                    except RunFailed as e:  # what finished is on record, and a run cut short resumes
                        sys.exit(f"block.py: {e}, then rerun the same command to continue")
                results.append(rec)
                with open(s["results"], "a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(f"{name} {s['corpus']} {seed}: val {rec['val_loss']:.3f}, linear {avg(rec['trained']['linear']):.1f} "
                      f"(twin {avg(rec['twin']['linear']):.1f}), kNN {avg(rec['trained']['knn']):.1f} "
                      f"(twin {avg(rec['twin']['knn']):.1f})", flush=True)
    with open(os.path.join(os.path.dirname(s["results"]), "results.md"), "w") as f:
        f.write(table(results))
    print(table(results))


if __name__ == "__main__":
    with user_errors("block.py"):
        main(sys.argv[1:])
