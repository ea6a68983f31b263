"""
Pretrain BERT or CrossBERT.

One process (CPU or one GPU):
    python train.py                                   # tiny CrossBERT on the built-in corpus
    python train.py config/tiny_bert.py               # its BERT twin
DDP on one node, or several (nccl on GPUs, gloo on CPUs):
    torchrun --standalone --nproc_per_node=8 train.py config/base_crossbert_dclm.py
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=... --master_port=29500 train.py ...
Resume a run from its out_dir:
    python train.py --init_from=resume

Settings are the globals below; config/*.py files and --key=value arguments override them.
"""
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
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import configure
from data.loader import TokenWindows
from flops import peak_flops, training_flops
from masking import make_views, view_shape
from model import MODELS, ModelConfig

# -----------------------------------------------------------------------------
# settings: the defaults train a tiny CrossBERT on 2 CPU cores in a few minutes
# model
model_type = "crossbert"      # bert | crossbert
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
pred_layer = None             # CrossBERT predictor depth; None = max(1, n_layer // 4)
mask_ratio = None             # None = the model's default: BERT 0.2, CrossBERT 0.5
cms = None                    # complementary views; None = the model's default: CrossBERT on, BERT off
random_replace = False        # BERT's 80/10/10 corruption
dropout = 0.0
init_std = 0.02
# data
dataset = "tinybooks"         # a folder under data/ (or any path) holding train.bin and val.bin
batch_size = 8                # input rows per micro-step per process
total_batch_size = 1024       # input tokens per optimizer step over all processes: rows x block_size
# optimizer: AdamW, linear warmup then cosine decay to min_lr
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 30
max_iters = 250
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0               # 0 = off
# evaluation, logging, checkpoints
out_dir = "out"
init_from = "scratch"         # scratch | resume (from out_dir/ckpt.pt)
eval_interval = 50
eval_iters = 10               # validation batches
log_interval = 10
probe_interval = 0            # >0: frozen-probe GLUE tasks every this many steps (probe.py)
probe_tasks = "SST-2"
probe_glue_dir = ""           # local GLUE folder; empty = from the hub
probe_max_train = 2000
# system
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
compile = True
seed = 1337
settings = {k: v for k, v in globals().items()
            if not k.startswith("_") and isinstance(v, (int, float, bool, str, type(None)))}
globals().update(configure(settings, sys.argv[1:]))
settings = {k: globals()[k] for k in settings}
# -----------------------------------------------------------------------------

ddp = "RANK" in os.environ  # set by torchrun
if ddp:
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
else:
    rank, local_rank, world_size = 0, 0, 1
master = rank == 0
device_type = "cuda" if device.startswith("cuda") else "cpu"


def log(*args):
    if master:
        print(*args, flush=True)


tokens_per_micro = batch_size * block_size * world_size
if total_batch_size % tokens_per_micro:
    sys.exit(f"total_batch_size={total_batch_size} must be a multiple of batch_size x block_size x processes "
             f"= {batch_size} x {block_size} x {world_size} = {tokens_per_micro}; change one of them")
grad_accum = total_batch_size // tokens_per_micro  # micro-steps per process per optimizer step
torch.manual_seed(seed + rank)  # dropout differs by rank; the data does not depend on this (see get_batch)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))

# data: every micro-batch, its windows and its masks are a function of (seed, split, global micro-batch index),
# so any number of processes x accumulation steps sees the same data, and a resumed run continues exactly
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
    sys.exit(f"{e}\n(run data/{dataset}/prepare.py first)")

model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, dropout=dropout,
                  init_std=init_std, random_replace=random_replace, pred_layer=pred_layer, mask_ratio=mask_ratio, cms=cms)
if model_type not in MODELS:
    sys.exit(f"model_type={model_type!r}: expected one of {sorted(MODELS)}")
try:
    model = MODELS[model_type](ModelConfig(**model_args))
    config = model.config  # with the model's defaults filled in
    n_views, _, _ = view_shape(block_size, config.mask_ratio, config.cms)
except ValueError as e:  # e.g. a mask ratio or block size that the views cannot be cut from
    sys.exit(str(e))


def get_batch(split, index):
    """Micro-batch number `index` of `split`: (tokens, views) on the device."""
    key = np.random.SeedSequence([seed, split == "val", index]).generate_state(2)
    x = windows[split].sample(batch_size, key)
    gen = torch.Generator().manual_seed(int(key[1]))
    views = make_views(batch_size, block_size, config.mask_ratio, config.cms, generator=gen)
    if device_type == "cuda":
        x, views = x.pin_memory().to(device, non_blocking=True), type(views)(
            *(t.pin_memory().to(device, non_blocking=True) for t in views))
    return x, views


def rng_state():
    """The state of the generator that dropout draws from (the data has its own, see get_batch)."""
    return torch.cuda.get_rng_state(device) if device_type == "cuda" else torch.get_rng_state()


def set_rng_state(state):
    torch.cuda.set_rng_state(state.cpu(), device) if device_type == "cuda" else torch.set_rng_state(state.cpu())


# -----------------------------------------------------------------------------
# model, optimizer, resume
ckpt_path = os.path.join(out_dir, "ckpt.pt")
step, tokens_seen, flops_seen, best_val_loss = 0, 0, 0.0, float("inf")
model.to(device)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if init_from == "resume":
    if not os.path.exists(ckpt_path):
        sys.exit(f"init_from=resume: no checkpoint at {ckpt_path}; check out_dir or start with init_from=scratch")
    ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
    if ckpt["model_type"] != model_type:
        sys.exit(f"{ckpt_path} holds a {ckpt['model_type']} model but model_type={model_type}; "
                 f"pass --model_type={ckpt['model_type']} or use another out_dir")
    now = asdict(config)
    diff = {k: (v, now.get(k)) for k, v in ckpt["model_args"].items() if now.get(k) != v}
    if diff:
        sys.exit(f"{ckpt_path} was trained with a different model config (checkpoint vs now): {diff}; "
                 f"pass the checkpoint's settings or use another out_dir")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    step, tokens_seen, flops_seen, best_val_loss = ckpt["step"], ckpt["tokens"], ckpt["flops"], ckpt["best_val_loss"]
    set_rng_state(ckpt["rng"][rank % len(ckpt["rng"])])
    log(f"resumed from {ckpt_path} at step {step}")
elif init_from != "scratch":
    sys.exit(f"init_from={init_from!r}: expected scratch or resume")
raw_model = model  # checkpoints hold its state_dict: no "_orig_mod." or "module." prefixes
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)

rows_per_step = batch_size * grad_accum * world_size
flops_per_step = training_flops(config, model_type, rows_per_step)
positions_per_step = rows_per_step * n_views * block_size  # as bench.py counts throughput
peak = peak_flops(torch.device(device), getattr(torch, dtype))
log(f"{model_type}: {raw_model.num_params() / 1e6:.2f}M parameters ({raw_model.num_params(True) / 1e6:.2f}M non-embedding), "
    f"mask ratio {config.mask_ratio}, {n_views} view(s) per row")
log(f"{world_size} process(es) x {grad_accum} micro-step(s) x {batch_size} rows x {block_size} tokens "
    f"= {total_batch_size} tokens per step; {flops_per_step / 1e9:.1f} GFLOPs per step; device {device}, {dtype}")


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    progress = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


@torch.no_grad()
def estimate_val_loss():
    """Mean loss over eval_iters fixed validation batches, split across processes."""
    model.eval()
    total = torch.zeros(2, device=device)
    for i in range(rank, eval_iters, world_size):
        x, views = get_batch("val", i)
        with autocast:
            _, loss = model(x, views)
        total += torch.stack([loss.float(), torch.ones((), device=device)])
    if ddp:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def save_checkpoint():
    """Write out_dir/ckpt.pt atomically: a crash mid-write leaves the previous checkpoint intact."""
    rng = [rng_state()]
    if ddp:  # every rank's dropout stream, so a resume continues each exactly
        mine = rng[0].to(device)  # nccl gathers GPU tensors only
        rng = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(rng, mine)
        rng = [r.cpu() for r in rng]
    if not master:
        return
    os.makedirs(out_dir, exist_ok=True)
    ckpt = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "model_type": model_type,
            "model_args": asdict(config), "config": settings, "step": step, "tokens": tokens_seen,
            "flops": flops_seen, "best_val_loss": best_val_loss, "rng": rng}
    torch.save(ckpt, ckpt_path + ".tmp")
    os.replace(ckpt_path + ".tmp", ckpt_path)
    log(f"saved checkpoint to {ckpt_path} (step {step})")


def stop_non_finite(what, value):
    saved = f"resume from {ckpt_path} (--init_from=resume)" if os.path.exists(ckpt_path) else "no checkpoint was written"
    sys.exit(f"step {step}: {what} is {value}; stopping without saving. {saved}, and try a lower "
             f"learning_rate (now {learning_rate}), a lower init_std (now {init_std}), or grad_clip")


def run_probe():
    from probe import probe_tasks as probe  # frozen GLUE probes on the bare model, the paper's monitor
    return probe(raw_model, probe_tasks, probe_glue_dir or None, probe_max_train)


# -----------------------------------------------------------------------------
# training loop
if master:
    os.makedirs(out_dir, exist_ok=True)
log_file = open(os.path.join(out_dir, "log.jsonl"), "a") if master else None
loss_sum = torch.zeros((), device=device)  # summed on the device; read only when logging, so no sync per step
t_log, steps_since_log = time.perf_counter(), 0
model.train()
while True:
    last = step == max_iters
    if step % eval_interval == 0 or last:
        val_loss = estimate_val_loss()
        if not math.isfinite(val_loss):
            stop_non_finite("the validation loss", val_loss)
        record = {"step": step, "val_loss": round(val_loss, 4), "tokens": tokens_seen, "flops": flops_seen}
        if probe_interval and step % probe_interval == 0:
            record["probe"] = run_probe()
        log(f"step {step}: val loss {val_loss:.4f}" + (f", probe {record['probe']}" if "probe" in record else ""))
        if log_file:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        best_val_loss = min(best_val_loss, val_loss)
        if step > 0:
            save_checkpoint()
        t_log = time.perf_counter()  # evaluation time is not training time
    if last:
        break

    lr = get_lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    for micro in range(grad_accum):
        x, views = get_batch("train", (step * grad_accum + micro) * world_size + rank)
        if ddp:  # all-reduce the gradients once, in the backward pass of the last micro-step
            model.require_backward_grad_sync = micro == grad_accum - 1
        with autocast:
            _, loss = model(x, views)
        (loss / grad_accum).backward()
        loss_sum += loss.detach() / grad_accum
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    steps_since_log += 1
    tokens_seen += rows_per_step * block_size
    flops_seen += flops_per_step

    if step % log_interval == 0 or step == max_iters:
        if ddp:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        train_loss = loss_sum.item() / steps_since_log
        if not math.isfinite(train_loss):
            stop_non_finite("the training loss", train_loss)
        dt = (time.perf_counter() - t_log) / steps_since_log
        record = {"step": step, "loss": round(train_loss, 4), "lr": lr, "tokens_per_s": round(positions_per_step / dt),
                  "mfu": round(flops_per_step / dt / peak, 4), "tokens": tokens_seen, "flops": flops_seen,
                  "ms_per_step": round(1000 * dt, 1)}
        log(f"step {step}: loss {train_loss:.4f}, lr {lr:.2e}, {record['tokens_per_s']} tok/s, "
            f"MFU {100 * record['mfu']:.1f}%, {1000 * dt:.0f} ms/step, {flops_seen:.2e} FLOPs")
        if log_file:
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        loss_sum.zero_()
        t_log, steps_since_log = time.perf_counter(), 0

log(f"done: {step} steps, {tokens_seen:,} tokens, {flops_seen:.2e} FLOPs; checkpoint at {ckpt_path}")
if ddp:
    dist.destroy_process_group()
