"""
The runs the experiments train and probe (sweep.py, acceptance.py, ladder_gpu.py): the presets, and the power
laws that give a FLOP budget its learning rate and batch; train.py launched on a run's settings, its log, and its
snapshots probed along training; the corpus a run trains on, prepared on first use; the probes' tasks, read and
tokenized once, and a model's frozen probes on them.
"""
import json
import os
import subprocess
import sys

import numpy as np

from plumbing.checkpoint import code_version
from data.tasks import load_task, task_list
from configurator import UserError, make_config
from evaluation.features import features, load_backbone, tokenize
from flops import budget_steps, param_counts, training_flops
from model import MODELS
from probe import probe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root: train.py, data/

# -----------------------------------------------------------------------------
# Presets. Power laws: lr = lr0 * (F / F0) ** LR_EXP and batch = batch0 * (F / F0) ** BATCH_EXP tokens, with
# DeepSeek LLM's fitted exponents (the paper fits such laws on its 50M-700M models and does not print them;
# our choice), anchored at (F0, lr0, batch0): the CPU recipe (experiments/LOG.md), or the GPU base configs.
LR_EXP, BATCH_EXP = -0.125, 0.327
PRESETS = {
    "cpu": dict(
        dataset="tinybooks", block_size=128, vocab_size=8192, dtype="",   # "" = train.py's default dtype
        sizes=[(2, 64, 2), (4, 128, 4), (4, 192, 4)],                     # (n_layer, n_embd, n_head)
        flops=[4e12, 1.6e13, 6.4e13],          # explicit training-FLOP budgets, one per size (0 = tokens_per_param)
        tokens_per_param=20,
        anchor=(1.6e13, 2e-3, 2048),           # (F0, lr0, batch0 tokens)
        ablation_size=1,                       # index into sizes; None: every size the plan has (with --axes)
        axes="main,mask,cms,predictor",        # sweep.py's default --axes
        flops_per_s=1.5e11,                    # achieved training FLOP/s on 2 CPU cores (bf16), for the time estimate,
        step_s=0.05,                           # + a fixed cost per step (small models are overhead-bound on CPUs)
        overhead_s=75,                         # + per run: compilation, validation, probing
        micro_batch=16,                        # rows per micro-step, at most (train.py's default)
        probe_max_train=2000, eval_interval=100, nproc=1,
    ),
    "cpu-gutenberg": dict(  # the long CPU preset: one shape, budgets doubling to the crossing (experiments/LOG.md)
        dataset="gutenberg", block_size=128, vocab_size=8192, dtype="",
        sizes=[(4, 256, 4)] * 5,
        flops=[3.4e13, 6.8e13, 1.35e14, 2.7e14, 5.4e14],
        tokens_per_param=20,
        anchor=(2.7e14, 1e-3, 4096),           # the 4 x 256 recipe that once beat its twins (experiments/LOG.md)
        ablation_size=None,
        axes="main",                           # the budget axis is the point
        flops_per_s=3.0e11,                    # achieved on 2 cores with native bf16, 4 x 256 (about 460 ms a step)
        step_s=0.02,
        overhead_s=240,
        micro_batch=16,
        probe_max_train=2000, eval_interval=200, nproc=1,
        seeds=3,
    ),
    "ladder": dict(  # the paper's axis: model size at 20 tokens per parameter, on web text (experiments/README.md)
        dataset="web", block_size=128, vocab_size=8192, dtype="",
        sizes=[(2, 128, 2), (3, 192, 3), (4, 256, 4)],
        flops=[0, 0, 0],                       # all from tokens_per_param: 20 tokens per BERT parameter, embeddings
                                               # included (the paper's model sizes count them; the dry run prints both)
        tokens_per_param=20,
        anchor=(3.4e13, 1.2956e-3, 2048),      # the block's recipe (4 x 256, experiments/LOG.md): lr and batch from it
        ablation_size=None,
        axes="main",                           # the ablations: --axes at the sizes of --budgets (experiments/README.md)
        families="bert,crossbert",             # ELECTRA with --families=bert,crossbert,electra
        flops_per_s=3.0e11,                    # achieved on 2 cores with native bf16 at 4 x 256 (experiments/LOG.md)
        step_s=0.03,
        overhead_s=420,                        # probing: the devtasks, GLUE and STS, for the run and its twin
        micro_batch=16,
        probe_max_train=2000, eval_interval=500, nproc=1,
        seeds=1,                               # seed 0 of every rung first; then --seeds=3 where the verdict is close
        snapshots=6,                           # probes along training at 1/32, 1/16, .., 1/2 of the budget and its end,
        snapshot_probe_s=30,                   # + per snapshot: the devtasks probed at every layer (2 x 128, 2 cores)
    ),
    "gpu": dict(
        dataset="dclm", block_size=512, vocab_size=0, dtype="",
        sizes=[(8, 512, 8), (12, 768, 12), (16, 1024, 16), (24, 1280, 20), (24, 1600, 25)],   # ~50M to ~800M
        flops=[0, 0, 0, 0, 0],
        tokens_per_param=20,
        anchor=(2e18, 1e-3, 262144),           # config/base_*_dclm.py: BERT-base size, 2.6B tokens
        ablation_size=1,
        axes="main,mask,cms,predictor",
        flops_per_s=8 * 989e12 * 0.35,         # 8 H100/H200 at 35% MFU
        step_s=0.0,
        overhead_s=300,
        # rows per micro-step per GPU, at most: 64 rows of the largest size took 65 (BERT), 97 (CrossBERT) and
        # 75 GiB (ELECTRA) at peak on one H200 (eager bf16, experiments/results/gpu/); on 80 GB GPUs pass
        # --micro_batch=32
        micro_batch=64,
        probe_max_train=20000, eval_interval=1000, nproc=8,
    ),
}


def read_families(spec, replace=False):
    """The model families of --families (comma-separated); one not in model.py's MODELS (or bert-801010, BERT's 80/10/10,
    where `replace`) is a UserError."""
    families = spec.split(",")
    known = [*MODELS, "bert-801010"] if replace else list(MODELS)
    unknown = [f for f in families if f not in known]
    if unknown:
        raise UserError(f"--families: unknown {', '.join(unknown)}; expected a comma-separated subset of "
                        f"{','.join(known)}")
    return families


def read_lr_scales(spec, example):
    """The multipliers of --lr_scales (comma-separated, each above 0); anything else, "" included, is a UserError that
    shows `example`."""
    try:
        scales = [float(m) for m in spec.split(",")]
    except ValueError:
        scales = []
    if not scales or any(m <= 0 for m in scales):
        raise UserError(f"--lr_scales={spec}: expected comma-separated positive multipliers, e.g. "
                        f"--lr_scales={example}")
    return scales


def split_batch(tokens, block_size, nproc, cap):
    """(total_batch_size, micro-batch rows): whole rows near `tokens`, split evenly over the processes, each
    process's rows cut into the fewest equal micro-steps of at most `cap` rows. Rows are rounded to make the
    micro-steps equal, so a micro-batch is never a small divisor of an awkward row count."""
    rows = max(1, round(tokens / (block_size * nproc)))  # per process
    micro_steps = -(-rows // cap)
    micro = -(-rows // micro_steps)
    return micro * micro_steps * nproc * block_size, micro


def run_settings(p, n_layer, n_embd, n_head, model_type, flops, **extra):
    """train.py settings for one run of preset p with a FLOP budget: lr and batch from the power laws."""
    F0, lr0, batch0 = p["anchor"]
    total, micro = split_batch(batch0 * (flops / F0) ** BATCH_EXP, p["block_size"], p["nproc"], p["micro_batch"])
    s = dict(model_type=model_type, n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=p["block_size"],
             dataset=p["dataset"], vocab_size=p["vocab_size"], max_flops=float(flops),
             learning_rate=lr0 * (flops / F0) ** LR_EXP, total_batch_size=total, batch_size=micro)
    if model_type == "bert":  # a ladder BERT under a plain name is all <mask>, as on record; -801010 names 80/10/10
        s["random_replace"] = False
    s.update(min_lr=s["learning_rate"] / 10, **extra)
    s["warmup_iters"] = max(1, steps_for(s)[0] // 20)  # 5% of the run
    return s


def steps_for(s):
    """(steps, FLOPs per step) of train.py's settings s: the most steps that fit in max_flops, or max_iters."""
    rows = s["total_batch_size"] // s["block_size"]
    per_step = training_flops(make_config(s), s["model_type"], rows)
    return budget_steps(s["max_flops"], per_step) if s.get("max_flops") else s["max_iters"], per_step


def size_budget(p, i):
    """The training FLOPs of preset p's i-th size: its explicit budget, or tokens_per_param tokens per
    parameter, counted on BERT (the baseline every budget is quoted for)."""
    if p["flops"][i]:
        return p["flops"][i]
    L, C, H = p["sizes"][i]
    cfg = make_config(dict(model_type="bert", n_layer=L, n_embd=C, n_head=H, block_size=p["block_size"],
                           vocab_size=p["vocab_size"]))
    return p["tokens_per_param"] * param_counts(cfg, "bert")[0] * training_flops(cfg, "bert") / cfg.block_size


# -----------------------------------------------------------------------------
# Training: train.py, one process or torchrun


class RunFailed(RuntimeError):
    """A train.py run that ended in an error; its train.log says why."""


def start(s, run_dir, nproc, compile, threads=None):
    """Start train.py on a run's settings (resuming from its checkpoint if it has one), its output appended to
    run_dir/train.log; the process. threads: its host threads (OMP_NUM_THREADS), so that runs side by side do not
    contend for the cores; None = the environment's."""
    args = {**s, "out_dir": run_dir, "compile": compile,
            "init_from": "resume" if os.path.exists(os.path.join(run_dir, "ckpt.pt")) else "scratch"}
    launcher = [sys.executable, "train.py"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]
    cmd = launcher + [f"--{k}={v}" for k, v in args.items() if v != ""]
    os.makedirs(run_dir, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    with open(os.path.join(run_dir, "train.log"), "a") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def train(name, s, run_dir, nproc, compile):
    """Train one run (or resume it from its checkpoint); its log goes to run_dir/train.log. RunFailed if it fails."""
    code = start(s, run_dir, nproc, compile).wait()
    if code:
        raise RunFailed(f"run {name} failed (exit {code}); see {run_dir}/train.log")


def run_record(name, axis, rs, run_dir, device, **extra):
    """(record, backbone): a finished run's line of results.jsonl, without its probes, and its final model with its
    vocabulary map (features.Backbone). The record holds its settings, size, budget, val losses, the code that trained
    it (None before checkpoints said) and the dtype it trained in (train.py picks the device's fastest: runs on two
    machines may differ)."""
    backbone, ckpt = load_backbone(os.path.join(run_dir, "ckpt.pt"), device)
    log = read_log(run_dir)
    vals = [x for x in log if "val_loss" in x]
    seed = rs.get("seed", 1337) - 1337
    r = dict(name=name, cell=name.removesuffix(f"-s{seed}") if seed else name, seed=seed,
             shape=f"{rs['n_layer']}x{rs['n_embd']}", axis=axis, model_type=rs["model_type"], settings=rs,
             params=backbone.model.num_params(), flops=ckpt["flops"], tokens=ckpt["tokens"], steps=ckpt["step"],
             val_loss=vals[-1]["val_loss"], unigram_loss=next(x["unigram_loss"] for x in log if "unigram_loss" in x),
             log=vals, code=ckpt.get("code"), dtype=ckpt["config"]["dtype"], **extra)
    return r, backbone


def twin_record(rs, seed, backbone):
    """The line of results.jsonl of a random-init twin (without its probes): the weights training seed `seed` of
    this family and shape starts from (features.random_twin), shared by every budget."""
    shape = f"{rs['n_layer']}x{rs['n_embd']}"
    name = f"random-{rs['model_type']}-{shape}"
    return dict(name=name + (f"-s{seed}" if seed else ""), cell=name, seed=seed, shape=shape, axis="random",
                model_type=rs["model_type"], settings=rs, params=backbone.model.num_params(), flops=0, tokens=0,
                steps=0, val_loss=None, unigram_loss=None, log=[], code=code_version())  # the code that made it


def read_log(run_dir):
    """The records of a run's log.jsonl, in order."""
    with open(os.path.join(run_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def trajectory(run_dir, device, probe_layers):
    """The probes along training: for each snapshot train.py kept (snapshots=N), its step, tokens, FLOPs, val loss
    and probe_layers(backbone), its scores by layer. The end of the run is the run's own record, its start the twin."""
    folder, points = os.path.join(run_dir, "snapshots"), []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        backbone, ckpt = load_backbone(os.path.join(folder, name), device)
        points.append(dict(step=ckpt["step"], tokens=ckpt["tokens"], flops=ckpt["flops"], val_loss=ckpt["val_loss"],
                           layers=probe_layers(backbone)))
    return points


def prepare_dataset(dataset, corpus):
    """The training tokens of data/<dataset>, prepared first from the files of `corpus` (data/local/prepare.py, or
    tinybooks' own script) if it has no val.bin; no corpus to prepare it from, or one that cannot be prepared, is a
    UserError."""
    data_dir = os.path.join(ROOT, "data", dataset)
    if not os.path.exists(os.path.join(data_dir, "val.bin")):
        if not corpus and dataset != "tinybooks":
            raise UserError(f"--corpus is needed: data/{dataset} is not prepared; pass the corpus's files, e.g. "
                            f"--corpus=DIR/{dataset}, or --dataset= a prepared folder under data/")
        script = "data/tinybooks/prepare.py" if dataset == "tinybooks" else "data/local/prepare.py"
        args = [] if dataset == "tinybooks" else [f"--input={corpus}", f"--out_dir={data_dir}"]
        if subprocess.run([sys.executable, script, *args], cwd=ROOT).returncode:
            raise UserError(f"could not prepare data/{dataset} from --corpus={corpus}; pass the corpus's files "
                            "(a folder or a glob of text, .jsonl or .parquet), or --dataset= a prepared folder under "
                            "data/")
    return os.path.getsize(os.path.join(data_dir, "train.bin")) // 2


# -----------------------------------------------------------------------------
# Probing: each task read and tokenized once, then mean-pooled features probed layer by layer


def tokenized_tasks(spec, max_train, block_size):
    """The tasks of --tasks (a folder of task folders, or a comma-separated list of them), each read once and
    tokenized once, for every model that is probed on them; bad or no tasks are a UserError."""
    tasks = []
    try:
        for name in task_list(spec):
            t = load_task(name, max_train=max_train)
            t["ids"] = {s: tokenize(t[s][0], block_size)[0] for s in ("train", "dev")}
            tasks.append(t)
    except UserError as e:
        raise UserError(f"--tasks: {e}") from None
    if not tasks:
        raise UserError(f"--tasks={spec}: no task folders there; pass folders of train.tsv and dev.tsv")
    return tasks


def probe_model(model, tasks, batch_size, layers=None):
    """{task: {"linear": %, "knn": %}, "linear_avg": %, "knn_avg": %}: mean-pooled probes (probe.py's) of the last
    layer; with layers, {layer: that} for each of them (0 = the token embeddings), from one pass over each task."""
    device = next(model.parameters()).device
    which = layers or [model.config.n_layer]
    out = {layer: {} for layer in which}
    for t in tasks:
        f = {s: features(model, t["ids"][s], which, batch_size=4 * batch_size) for s in ("train", "dev")}
        for layer in which:
            r = probe(f["train"][layer], t["train"][1], f["dev"][layer], t["dev"][1], t["classes"], t["metrics"],
                      device=device)
            out[layer][t["name"]] = {p: r[p]["score"] for p in ("linear", "knn")}
    for layer in which:
        for p in ("linear", "knn"):
            out[layer][f"{p}_avg"] = float(np.mean([out[layer][t["name"]][p] for t in tasks]))
    return out if layers else out[which[0]]
