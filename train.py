"""
Pretrain BERT, CrossBERT or ELECTRA.

One process (CPU or one GPU):
    python train.py                                   # tiny CrossBERT on the built-in corpus
    python train.py config/tiny_bert.py               # its BERT twin
    python train.py config/tiny_electra.py            # its ELECTRA twin
DDP on one node, or several (nccl on GPUs, gloo on CPUs):
    torchrun --standalone --nproc_per_node=8 train.py config/base_crossbert_dclm.py
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=... --master_port=29500 train.py ...
Resume a run from its out_dir:
    python train.py --init_from=resume

Settings are the globals below; config/*.py files and --key=value arguments override them.
"""
import datetime
import gc
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
from configurator import check_writable, configure, fail, user_errors_hook
from data.loader import TokenWindows, unigram_loss
from data.tasks import GLUE, EvalError, load_task
from data.tokenizer import compact_vocab
from flops import budget_steps, checked_peak, fastest_dtype, peak_flops, peak_from_table, training_flops
from masking import Views, view_shape
from model import MODELS, make_config

user_errors_hook("train.py", EvalError)  # e.g. a path that cannot be written, anywhere below, ends in one line

# -----------------------------------------------------------------------------
# settings: the defaults train a tiny CrossBERT on 2 CPU cores in under 10 minutes (see README: the CPU recipe)
# model
model_type = "crossbert"      # bert | crossbert | electra
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
pred_layer = None             # CrossBERT predictor depth; None = max(1, n_layer // 4)
mask_ratio = None             # None = the model's default: BERT 0.2, CrossBERT 0.5, ELECTRA 0.15
cms = None                    # complementary views; None = the model's default: on for CrossBERT only
random_replace = False        # BERT's 80/10/10 corruption
gen_width = 0.25              # ELECTRA's generator width, a fraction of n_embd (rounded to whole heads)
gen_layer = None              # ELECTRA's generator depth; None = n_layer
rtd_weight = 50.0             # ELECTRA's loss: generator MLM + rtd_weight x replaced-token detection
mlp = "geglu"                 # the block: geglu (gated, as ModernBERT's) | gelu (the plain 4 x n_embd MLP)
emb_norm = True               # LayerNorm on the token embeddings
lm_head = True                # the MLM prediction head (dense, GELU, LayerNorm) before the tied decoder
decoder_bias = True           # a bias on the decoder's logits
dropout = 0.0
init_std = 0.02
vocab_size = 8192             # 0 = GPT-2's 50,304 ids; K = a compact vocabulary, the train split's K - 3 most
                              # frequent ids + <unk>, <mask>, <pad> (data/tokenizer.py), for head-bound small models
# data
dataset = "tinybooks"         # a folder under data/ (or any path) holding train.bin and val.bin
batch_size = 16               # at most this many input rows per micro-step per process
total_batch_size = 2048       # input tokens per optimizer step over all processes: rows x block_size
# optimizer: AdamW, linear warmup then cosine decay to min_lr
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
max_iters = 1500
max_flops = 0.0               # >0: a training-FLOP budget (flops.py's count) that sets max_iters, for compute-matched runs
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0               # 0 = off
# evaluation, logging, checkpoints
out_dir = "out"
init_from = "scratch"         # scratch | resume (from out_dir/ckpt.pt)
overwrite = False             # a scratch run may replace the checkpoint already in out_dir (never by default)
eval_interval = 250
eval_iters = 10               # validation batches
log_interval = 50
probe_interval = 0            # >0: frozen-probe GLUE tasks every this many steps (probe.py)
probe_tasks = "SST-2"
probe_glue_dir = ""           # local GLUE folder; empty = from the hub
probe_max_train = 2000
# system
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = fastest_dtype("cuda" if torch.cuda.is_available() else "cpu")  # bf16 where the device has it natively
compile = True
fsdp = False                  # with torchrun: shard the model over the processes (FSDP2) instead of replicating it (DDP)
seed = 1337
settings = {k: v for k, v in globals().items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}
globals().update(configure(settings, sys.argv[1:], types={"pred_layer": int, "gen_layer": int, "mask_ratio": float,
                                                           "cms": bool}))
settings = {k: globals()[k] for k in settings}

# one pass over the settings, before anything is built or written: each failure names the setting and the fix
for name in ("batch_size", "total_batch_size", "max_iters", "eval_interval", "eval_iters", "log_interval"):
    if globals()[name] < 1:
        fail(f"{name}={globals()[name]}: must be at least 1")
for name in ("warmup_iters", "max_flops", "grad_clip", "weight_decay", "min_lr", "probe_interval", "dropout",
             "rtd_weight"):
    if globals()[name] < 0:
        fail(f"{name}={globals()[name]}: must be >= 0" + (" (0 turns clipping off)" if name == "grad_clip" else ""))
try:  # the model's shape, masking and vocabulary, checked by ModelConfig (with the model's defaults filled in)
    config = make_config(settings)
except ValueError as e:
    fail(str(e))
n_views, _, n_predicted = view_shape(block_size, config.mask_ratio, config.cms)
if not (learning_rate > 0 and 0 <= beta1 < 1 and 0 <= beta2 < 1 and dropout < 1):
    fail("learning_rate must be > 0, and beta1, beta2 and dropout in [0, 1)")
if dtype not in ("float32", "bfloat16"):
    fail(f"dtype={dtype!r}: expected float32 or bfloat16")
if device.startswith("cuda") and not torch.cuda.is_available():
    fail(f"device={device!r}, but this machine has no CUDA device (or torch is a CPU build); use --device=cpu")
if not device.startswith(("cpu", "cuda")):
    fail(f"device={device!r}: expected cpu or cuda[:N]")
if init_from not in ("scratch", "resume"):
    fail(f"init_from={init_from!r}: expected scratch or resume")
check_writable(out_dir, "out_dir")
if probe_interval:  # local probe tasks are read now, so a bad one stops the run before it starts (the hub's: at step 0)
    try:
        for task in probe_tasks.split(","):
            if probe_glue_dir or task.upper() not in map(str.upper, GLUE):
                load_task(task, probe_glue_dir or None, probe_max_train)
    except EvalError as e:
        fail(f"probe_tasks: {e}")
# -----------------------------------------------------------------------------

ddp = "RANK" in os.environ  # set by torchrun
rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
master = rank == 0

# the batch: total_batch_size is fixed; each process takes an equal share of a step's rows, in micro-steps of
# at most batch_size rows, so any number of processes sees the same data (see get_batch)
rows_per_step = total_batch_size // block_size
if total_batch_size % block_size or rows_per_step % world_size or not rows_per_step:
    quantum = block_size * world_size
    lo = max(quantum, total_batch_size // quantum * quantum)
    fail(f"total_batch_size={total_batch_size} must be a multiple of block_size x processes = {block_size} x "
         f"{world_size} = {quantum}; the nearest values that work are {lo} and {lo + quantum}")
rows_per_process = rows_per_step // world_size
micro_batch = max(b for b in range(1, min(batch_size, rows_per_process) + 1) if rows_per_process % b == 0)
grad_accum = rows_per_process // micro_batch  # micro-steps per process per optimizer step

if ddp:
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    # the other processes wait out the master's probes in this group: a probe may take longer than the process
    # group's timeout (10-30 min), which would end the run in whatever collective they waited in instead
    probe_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1)) if probe_interval else None
device_type = "cuda" if device.startswith("cuda") else "cpu"


def log(*args):
    if master:
        print(*args, flush=True)


torch.manual_seed(seed)  # the same initial weights in every process (FSDP does not broadcast them, as DDP does)
if device_type == "cpu":
    # same seed, same losses, bit for bit (on one machine and thread count): compiled code sums the embedding's
    # gradient with atomic adds, whose order changes from run to run; this costs about 3% of a step. On GPUs it stays
    # off: cuBLAS then needs a workspace setting, and FlashAttention's backward has no deterministic kernel
    torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))

# data: memory-mapped token files, prepared on first use for the built-in corpus
data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", dataset)
if dataset == "tinybooks" and not os.path.exists(os.path.join(data_dir, "val.bin")):
    if master:
        from data.tinybooks.prepare import prepare
        prepare()
    if ddp:
        dist.barrier()
try:
    windows = {split: TokenWindows(os.path.join(data_dir, f"{split}.bin"), block_size) for split in ("train", "val")}
except (FileNotFoundError, ValueError) as e:
    fail(f"{e} (prepare it with data/<corpus>/prepare.py --out_dir={data_dir})")
counts = {split: w.counts for split, w in windows.items()}
vocab_map = compact_vocab(counts["train"], vocab_size) if vocab_size else None
if vocab_map is not None:  # token counts in the model's own ids, for the unigram baseline
    counts = {split: np.bincount(vocab_map, weights=c, minlength=vocab_size) for split, c in counts.items()}
# a model that ignores context and predicts the train split's token frequencies scores this on val:
# a val loss near it means the model has learned word frequencies and nothing else
unigram = unigram_loss(counts["train"], counts["val"])

model = MODELS[model_type](config)
if vocab_map is not None:
    model.vocab_map.copy_(torch.from_numpy(vocab_map))
torch.manual_seed(seed + rank)  # dropout differs by process; the data does not depend on this (see get_batch)


def get_batch(split, index, rows=slice(None)):
    """Rows `rows` of batch number `index` of `split` (a step's rows_per_step rows), on the device: the model's
    arguments, the tokens and the model's random inputs (model.draw(): the views, ELECTRA's sampling uniforms).

    Every row's window and random inputs are a function of (seed, split, index, row), so any split of a batch
    over processes and micro-steps sees the same data, and a resumed run continues exactly. The seed changes the
    training data and the initial weights, nothing else.
    """
    # validation batches are the same for every seed (the default seed's), so val losses compare across seeds
    key = np.random.SeedSequence([seed if split == "train" else 1337, split == "val", index]).generate_state(2)
    idx = windows[split].sample(rows_per_step, key, rows)
    draws = raw_model.draw(rows_per_step, block_size, generator=torch.Generator().manual_seed(int(key[1])))
    lo, hi, _ = rows.indices(rows_per_step)
    mine = slice(lo * n_views, hi * n_views)  # the views of input rows lo..hi-1, renumbered from 0 (views are rows)
    batch = [idx, *(Views(d.rows[mine] - lo, d.visible_pos[mine], d.target_pos[mine]) if isinstance(d, Views)
                    else d[mine] for d in draws)]
    if device_type == "cuda":
        batch = [t.pin_memory().to(device, non_blocking=True) if torch.is_tensor(t) else
                 type(t)(*(x.pin_memory().to(device, non_blocking=True) for x in t)) for t in batch]
    return batch


def rng_state():
    """The state of the generator that dropout draws from (the data has its own, see get_batch)."""
    return torch.cuda.get_rng_state(device) if device_type == "cuda" else torch.get_rng_state()


def set_rng_state(state):
    torch.cuda.set_rng_state(state.cpu(), device) if device_type == "cuda" else torch.set_rng_state(state.cpu())


# -----------------------------------------------------------------------------
# model, optimizer, resume
ckpt_path = os.path.join(out_dir, "ckpt.pt")
step, tokens_seen, flops_seen = 0, 0, 0.0
model.to(device)
if fsdp:  # FSDP2: each block's parameters, gradients and optimizer state are sharded over the processes
    if not ddp:
        fail("fsdp=True shards over processes: launch with torchrun --nproc_per_node=N (N > 1), or drop fsdp")
    from torch.distributed.fsdp import fully_shard
    for block in [*model.blocks, *getattr(model, "predictor", []), *getattr(model, "generator", [])]:
        fully_shard(block)
    fully_shard(model)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
# checkpoints hold full (unsharded) state dicts, keyed by parameter name, so probe.py reads any run's checkpoint
# and a run can resume with or without FSDP; with FSDP, gathering them is a collective over every process
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
# settings a resumed run may change; any other difference would break "resume continues exactly"
RESUMABLE = {"init_from", "out_dir", "max_iters", "max_flops", "eval_interval", "eval_iters", "log_interval",
             "probe_interval", "probe_tasks", "probe_glue_dir", "probe_max_train", "compile", "device", "batch_size",
             "fsdp", "overwrite"}
if init_from == "resume":
    if not os.path.exists(ckpt_path):
        fail(f"init_from=resume: no checkpoint at {ckpt_path}; check out_dir or start with init_from=scratch")
    try:
        ckpt = checkpoint.read_checkpoint(ckpt_path)  # on the CPU: the state is copied into the model and optimizer
    except ValueError as e:
        fail(f"{e} (or start over: --init_from=scratch --overwrite=True)")
    if ckpt["model_type"] != model_type:
        fail(f"{ckpt_path} holds a {ckpt['model_type']} model but model_type={model_type}; "
             f"pass --model_type={ckpt['model_type']} or use another out_dir")
    now = asdict(config)
    diff = {k: (v, now.get(k)) for k, v in ckpt["model_args"].items() if now.get(k) != v}
    if diff:
        fail(f"{ckpt_path} was trained with a different model config (checkpoint vs now): {diff}; "
             f"pass the checkpoint's settings or use another out_dir")
    diff = {k: (v, settings.get(k)) for k, v in ckpt["config"].items() if k not in RESUMABLE and settings.get(k) != v}
    if diff:
        fail(f"{ckpt_path} was trained with different settings (checkpoint vs now): {diff}; a resumed run "
             f"continues exactly only with the same ones: pass them, or use another out_dir")
    set_model_state_dict(model, ckpt["model"], options=FULL)
    set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=FULL)
    step, tokens_seen, flops_seen = ckpt["step"], ckpt["tokens"], ckpt["flops"]
    if ckpt.get("rng_device", device_type) == device_type:
        set_rng_state(ckpt["rng"][rank % len(ckpt["rng"])])
    else:  # a generator's state cannot move between device types; only dropout draws from it (data has its own)
        log(f"note: {ckpt_path} holds {ckpt['rng_device']} RNG states and this run is on {device_type}: dropout draws a "
            f"fresh stream{' (dropout is 0: nothing changes)' if not dropout else ', so the run is no longer exact'}")
    log(f"resumed from {ckpt_path} at step {step}")
    resumed_max_iters = ckpt.get("max_iters")  # the run's length after its budget (older checkpoints: unknown)
    del ckpt  # the copies live in the model and optimizer now
elif os.path.exists(ckpt_path) and not overwrite:
    fail(f"{out_dir} already holds a checkpoint ({ckpt_path}); resume it with --init_from=resume, pick another "
         "--out_dir, or pass --overwrite=True to replace it")
raw_model = model  # checkpoints hold its state_dict: no "_orig_mod." or "module." prefixes
if compile:
    model = torch.compile(model)
if ddp and not fsdp:  # the only buffers are the RoPE tables and the vocabulary map, which never change: no broadcasts
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, broadcast_buffers=False)

flops_per_step = training_flops(config, model_type, rows_per_step)  # all processes together
if max_flops:  # a compute budget: the most steps that fit in it, and the LR schedule follows
    max_iters = budget_steps(max_flops, flops_per_step)
if init_from == "resume" and resumed_max_iters not in (None, max_iters):
    log(f"note: the run was {resumed_max_iters} steps long and is now {max_iters}: the cosine schedule follows the new "
        f"length from step {step} on, so this run equals neither length run from scratch")
tokens_per_step = rows_per_step * block_size               # input tokens: unique data
positions_per_step = rows_per_step * n_views * block_size  # view positions: what complementary masking multiplies
peak = peak_flops(torch.device(device), getattr(torch, dtype)) * world_size  # every device's peak
log(f"{model_type}: {raw_model.num_params() / 1e6:.2f}M parameters ({raw_model.num_params(True) / 1e6:.2f}M non-embedding), "
    f"vocabulary {config.vocab_size}, mask ratio {n_predicted / block_size:.4g}, {n_views} view(s) per row, "
    f"{n_views * n_predicted} of {block_size} positions predicted per row")
log(f"{world_size} process(es) x {grad_accum} micro-step(s) x {micro_batch} rows x {block_size} tokens "
    f"= {total_batch_size} tokens per step; {flops_per_step / 1e9:.2f} GFLOPs per step; {max_iters} steps = "
    f"{max_iters * flops_per_step:.2e} FLOPs; device {device}, {dtype}")
log(f"MFU is against a peak of {peak / world_size:.3g} FLOP/s per device ("
    f"{'its datasheet' if peak_from_table(torch.device(device), getattr(torch, dtype)) else 'the best of 10 matmuls'})")
log(f"unigram baseline: a model that ignores context scores {unigram:.4f} nats on val")


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    progress = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


def metrics(loss, stats):
    """What a step reports, as one tensor: the loss, then the model's stats (a composite loss's parts; see
    model.py). Summed on the device and read only when logging, so there is no host sync per step."""
    return torch.stack([loss.detach().float(), *(v.float() for v in stats.values())])


def my_rows(micro):
    """This process's rows of a step's batch in micro-step `micro`."""
    first = (rank * grad_accum + micro) * micro_batch
    return slice(first, first + micro_batch)


@torch.no_grad()
def estimate_val_loss():
    """{"loss": mean, and each of the model's stats: mean} over eval_iters fixed validation batches. Each batch is
    the size of a training step and is split over processes and micro-steps as a step is, so neither batch_size nor
    the process count changes the data."""
    model.eval()
    total = 0
    for i in range(eval_iters):
        for micro in range(grad_accum):  # equal micro-batches: the mean of their means is the batch's mean
            with autocast:
                loss, stats = model(*get_batch("val", i, my_rows(micro)))
            total = total + torch.cat([metrics(loss, stats), torch.ones(1, device=device)])
    if ddp:
        dist.all_reduce(total)
    model.train()
    return dict(zip(["loss", *stats], (total[:-1] / total[-1]).tolist()))


def save_checkpoint():
    """Gather every process's state and write out_dir/ckpt.pt (atomically: see checkpoint.py)."""
    rng = [rng_state()]
    if ddp:  # every rank's dropout stream, so a resume continues each exactly
        mine = rng[0].to(device)  # nccl gathers GPU tensors only
        rng = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(rng, mine)
        rng = [r.cpu() for r in rng]
    state = get_model_state_dict(raw_model, options=FULL)
    optim_state = get_optimizer_state_dict(raw_model, optimizer, options=FULL)
    if not master:
        return
    ckpt = {"model": state, "optimizer": optim_state, "model_type": model_type,
            "model_args": asdict(config), "config": settings, "step": step, "tokens": tokens_seen,
            "flops": flops_seen, "rng": rng, "rng_device": device_type,
            "max_iters": max_iters}
    checkpoint.save_checkpoint(ckpt_path, ckpt)
    log(f"saved checkpoint to {ckpt_path} (step {step})")


def stop_non_finite(what, value):
    saved = f"resume from {ckpt_path} (--init_from=resume)" if os.path.exists(ckpt_path) else "no checkpoint was written"
    sys.exit(f"step {step}: {what} is {value}; stopping without saving. {saved}, and try a lower "
             f"learning_rate (now {learning_rate}), a lower init_std (now {init_std}), or grad_clip")


def run_probe():
    """Frozen GLUE probes, the paper's monitor, on the master process; every process calls this."""
    from probe import probe_tasks as probe
    target = raw_model
    if fsdp:  # a sharded model cannot run on one process alone: probe an unsharded copy
        state = get_model_state_dict(raw_model, options=FULL)
        if master:
            target = type(raw_model)(config).to(device)
            target.load_state_dict(state)
    scores = probe(target, probe_tasks, probe_glue_dir or None, probe_max_train) if master else None
    if ddp:
        dist.barrier(group=probe_group)
    return scores


log_path = os.path.join(out_dir, "log.jsonl")
if master:
    os.makedirs(out_dir, exist_ok=True)
    kept = []
    if init_from == "resume" and os.path.exists(log_path):  # drop what the resumed run will write again
        with open(log_path) as f:
            records = [json.loads(line) for line in f]
        # the step's training record stays; its validation record will be written again
        kept = [r for r in records if r["step"] < step or (r["step"] == step and "loss" in r)]
    if init_from == "scratch" and os.path.exists(ckpt_path):  # overwrite=True: the old run ends here, so a crash
        os.remove(ckpt_path)                                    # before the first save cannot leave it beside the new log
    with open(log_path + ".tmp", "w") as f:  # a scratch run starts a new log: records never mix across runs
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(log_path + ".tmp", log_path)
log_file = open(log_path, "a") if master else None


def write_log(record):
    if log_file:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()


write_log({"step": step, "unigram_loss": round(unigram, 4), "max_iters": max_iters, "flops_per_step": flops_per_step,
           "tokens_per_step": tokens_per_step, "positions_per_step": positions_per_step, "world_size": world_size,
           "peak_flops_per_device": peak / world_size, "mask_ratio": n_predicted / block_size})


def on_interrupt(kind, value, tb):
    """Ctrl-C: one line that names the checkpoint to resume from (checkpoint.save_checkpoint holds a Ctrl-C that
    lands mid-write until the file is whole, so no temp file is left behind)."""
    if not issubclass(kind, KeyboardInterrupt):
        return excepthook(kind, value, tb)  # user_errors_hook's: one line for a path that cannot be written
    where = (f"the last checkpoint is {ckpt_path}; continue with --init_from=resume --out_dir={out_dir}"
             if os.path.exists(ckpt_path) else "no checkpoint was written yet")
    print(f"train.py: interrupted at step {step}; {where}", file=sys.stderr)


excepthook, sys.excepthook = sys.excepthook, on_interrupt

# -----------------------------------------------------------------------------
# training loop
loss_sum = 0  # metrics() summed on the device; read only when logging, so no sync per step
t_log, steps_since_log = time.perf_counter(), 0
model.train()
while True:
    last = step >= max_iters
    if step % eval_interval == 0 or last:
        t_eval = time.perf_counter()
        val = estimate_val_loss()
        if not all(map(math.isfinite, val.values())):
            stop_non_finite("the validation loss", val)
        # the masked-token loss, which the unigram baseline bounds: the loss, or a composite loss's mlm_loss part
        total_loss = val.pop("loss")
        val_loss = val.pop("mlm_loss", total_loss)
        record = {"step": step, "val_loss": round(val_loss, 4), "below_unigram": round(unigram - val_loss, 4),
                  "tokens": tokens_seen, "flops": flops_seen, **{f"val_{k}": round(v, 4) for k, v in val.items()}}
        gap = unigram - val_loss
        line = (f"step {step}: val loss {val_loss:.4f}, {abs(gap):.3f} nats {'below' if gap >= 0 else 'above'} the "
                f"unigram baseline {unigram:.3f}" + "".join(f", {k} {v:.4f}" for k, v in val.items()))
        if probe_interval and step % probe_interval == 0:
            record["probe"] = run_probe()
        log(line + (f", probe {record['probe']}" if "probe" in record else ""))
        write_log(record)
        if step > 0:
            save_checkpoint()
        t_log += time.perf_counter() - t_eval  # evaluation time is not training time
    if last:
        break

    lr = get_lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    for micro in range(grad_accum):
        batch = get_batch("train", step, my_rows(micro))
        if ddp:  # all-reduce (or reduce-scatter) the gradients once, in the backward pass of the last micro-step
            if fsdp:
                raw_model.set_requires_gradient_sync(micro == grad_accum - 1)
            else:
                model.require_backward_grad_sync = micro == grad_accum - 1
        with autocast:
            loss, stats = model(*batch)
        (loss / grad_accum).backward()
        loss_sum = loss_sum + metrics(loss, stats) / grad_accum
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    steps_since_log += 1
    tokens_seen += tokens_per_step
    flops_seen += flops_per_step

    if step % log_interval == 0 or step >= max_iters:
        if ddp:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        train_loss, *parts = (loss_sum / steps_since_log).tolist()
        if not math.isfinite(train_loss):
            stop_non_finite("the training loss", train_loss)
        dt = (time.perf_counter() - t_log) / steps_since_log
        parts = dict(zip(stats, parts))  # the names of the model's stats, in the order metrics() stacked them
        if flops_per_step / dt > peak:  # the peak was measured on a busy machine (flops.checked_peak)
            peak = checked_peak(peak, flops_per_step / dt, lambda: world_size * peak_flops(torch.device(device), getattr(torch, dtype)))
            log(f"note: this run beat the matmul peak measured at its start; peak now {peak / world_size:.3g} FLOP/s "
                f"per device (measured again, and at least what the run achieved)")
            write_log({"step": step, "peak_flops_per_device": peak / world_size})
        record = {"step": step, "loss": round(train_loss, 4), "lr": lr, **{k: round(v, 4) for k, v in parts.items()},
                  "input_tokens_per_s": round(tokens_per_step / dt), "view_positions_per_s": round(positions_per_step / dt),
                  "mfu": round(flops_per_step / dt / peak, 4), "tokens": tokens_seen, "flops": flops_seen,
                  "ms_per_step": round(1000 * dt, 1)}
        parts = f" ({', '.join(f'{k} {v:.4f}' for k, v in parts.items())})" if parts else ""
        log(f"step {step}/{max_iters}: loss {train_loss:.4f}{parts}, lr {lr:.2e}, {record['input_tokens_per_s']} input tok/s "
            f"({record['view_positions_per_s']} view positions/s), MFU {100 * record['mfu']:.1f}%, "
            f"{1000 * dt:.0f} ms/step, {flops_seen:.2e} FLOPs")
        write_log(record)
        loss_sum = 0
        t_log, steps_since_log = time.perf_counter(), 0

log(f"done: {step} steps, {tokens_seen:,} tokens, {flops_seen:.2e} FLOPs; checkpoint at {ckpt_path}")
if ddp:
    # free what holds the process group (DDP/FSDP state, the optimizer) while the interpreter is alive, then leave
    # together: a gloo group left for interpreter exit to destroy can abort with "terminate called without an
    # active exception" after the run has finished
    del model, raw_model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
