"""
Pretrain BERT, CrossBERT or ELECTRA, on one process (CPU or GPU) or with torchrun (DDP, or FSDP2 with --fsdp=True):

    python train.py                                   # tiny CrossBERT on the built-in corpus
    python train.py config/tiny_bert.py               # its BERT twin (config/tiny_electra.py: its ELECTRA twin)
    python train.py --init_from=resume                # continue the run in out_dir, exactly
    torchrun --standalone --nproc_per_node=8 train.py config/base_crossbert_dclm.py   # a GPU node

Settings are ModelConfig's fields (model.py) and the globals below; config/*.py files and --key=value arguments
override them, in order. On SIGTERM or SIGUSR1 (a cluster's preemption) a run saves the step it is in and exits with
status 75; --init_from=resume continues it exactly.
"""
import datetime
import functools
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import UserError, configure, fail, user_errors, user_errors_hook
from data.corpus import prepare_tinybooks
from data.loader import load_splits
from flops import budget_steps, training_flops
from masking import draws_of_rows
from model import MODELS, ModelConfig
from plumbing import checkpoint, run
from plumbing.checks import optional
from plumbing.throughput import Peak, fastest_dtype

user_errors_hook("train.py")  # e.g. a path that cannot be written, anywhere below, ends in one line

# -----------------------------------------------------------------------------
# settings: the defaults train a tiny CrossBERT on 2 CPU cores (README: minutes, by CPU), the ladder's smallest rung
# (2 x 128 at 1.2e14 FLOPs, 20 tokens per parameter of its BERT), which beats its random twin (experiments/LOG.md)
# model: ModelConfig's fields at its defaults, with a compact vocabulary of the corpus's most frequent ids (small
# models are head-bound; 0 = GPT-2's 50,304 ids)
model_settings = {f.name: f.default for f in fields(ModelConfig)} | dict(vocab_size=8192)
# data
dataset = "tinybooks"         # a folder under data/ (or any path) holding train.bin and val.bin
batch_size = 16               # at most this many input rows per micro-step per process
total_batch_size = 3072       # input tokens per optimizer step over all processes: rows x block_size
# optimizer: AdamW, linear warmup then cosine decay to min_lr
learning_rate = 1.1055e-3     # lr and batch: the sweep's power laws at this budget (experiments/runs.py)
min_lr = 1.1055e-4
warmup_iters = 191
max_iters = 3825              # 1.2e14 FLOPs of this CrossBERT
max_flops = 0.0               # >0: a training-FLOP budget (flops.py's count) that sets max_iters: compute-matched runs
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
wandb_log = False             # also send log.jsonl's records to Weights & Biases, live (pip install wandb)
wandb_project = "crossbert"
wandb_run_name = ""           # empty = out_dir
checkpoint_evals = True       # the full checkpoint at every evaluation; False: at the end (and SIGTERM) only
snapshots = 0                 # >0: also keep the weights at max_iters / 2^k for k = snapshots-1 .. 1 and the end, each
                              # with its val loss: probes along training
# system
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = fastest_dtype("cuda" if torch.cuda.is_available() else "cpu")  # bf16 where the device has it natively
compile = True
cuda_graphs = True            # one CUDA process: torch.compile's reduce-overhead mode (False: its default mode)
fsdp = False                  # with torchrun: shard the model over the processes (FSDP2) instead of DDP's replicas
join_timeout = 300.0          # seconds a process waits for the master's address to answer before it stops
seed = 1337
settings = model_settings | {k: v for k, v in globals().items() if not k.startswith("_") and k != "model_settings"
                             and isinstance(v, (int, float, bool, str))}
none_types = {f.name: f.type.__args__[0] for f in fields(ModelConfig) if f.default is None}  # int | None -> int
settings = configure(settings, sys.argv[1:], none_types,
                     help_from=[__file__, os.path.join(os.path.dirname(__file__), "model.py")])
globals().update(settings)

# -----------------------------------------------------------------------------
# setup: processes, the batch, data, model, optimizer
ddp = "RANK" in os.environ  # set by torchrun
rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
master = rank == 0
with user_errors("train.py"):  # every setting checked, and wandb there if asked for; the checkpoint to resume, if any
    config, ckpt = run.check_run(settings, world_size)
    wandb = optional("wandb", "--wandb_log=True") if wandb_log else None
n_views, _, n_predicted = config.views
# total_batch_size is fixed; each process takes an equal share of a step's rows, in micro-steps of at most batch_size
# rows, so any number of processes sees the same data (see get_batch)
rows_per_step = total_batch_size // block_size
rows_per_process = rows_per_step // world_size
micro_batch = max(b for b in range(1, min(batch_size, rows_per_process) + 1) if rows_per_process % b == 0)
grad_accum = rows_per_process // micro_batch  # micro-steps per process per optimizer step
if ddp:  # this process's GPU, and the process group (the other ranks wait, at most join_timeout, for the master)
    device = run.init_processes(device, rank, local_rank, join_timeout)
# the other processes wait out the master's probes in a group of their own, with a long timeout (run.probe_run)
probe_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1)) if ddp and probe_interval else None
device_type = "cuda" if device.startswith("cuda") else "cpu"
log = functools.partial(print, flush=True) if master else lambda *args: None
torch.manual_seed(seed)  # the same initial weights in every process (FSDP does not broadcast them, as DDP does)
if device_type == "cpu":
    # same seed, same losses, bit for bit (on one machine and thread count): compiled code sums the embedding's
    # gradient with atomic adds, whose order changes from run to run; this costs about 3% of a step. On GPUs it stays
    # off: cuBLAS then needs a workspace setting, and FlashAttention's backward has no deterministic kernel
    torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, dtype=getattr(torch, dtype))

# data: memory-mapped token files (the built-in corpus is prepared at first use), the compact vocabulary's map from
# GPT-2 ids to the model's (applied to each batch, and kept in the checkpoint), the unigram baseline
data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", dataset)
if dataset == "tinybooks" and not os.path.exists(os.path.join(data_dir, "val.bin")) and master:
    prepare_tinybooks()
if ddp:
    dist.barrier()
try:
    windows, vocab_map, unigram = load_splits(data_dir, block_size, vocab_size)
except (FileNotFoundError, UserError) as e:
    fail(f"{e} (prepare it with data/<corpus>/prepare.py --out_dir={data_dir})")
vocab_map = None if vocab_map is None else torch.from_numpy(vocab_map)

# the model, its optimizer, and the state of the run it resumes, if any
model = MODELS[model_type](config)
torch.manual_seed(seed + rank)  # dropout differs by process; the data does not depend on this (see get_batch)
model.to(device)
if fsdp:
    run.shard(model)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
ckpt_path = os.path.join(out_dir, "ckpt.pt")
step, tokens_seen, flops_seen, resumed_max_iters, wandb_id = 0, 0, 0.0, None, None
if ckpt:  # the run goes on where its checkpoint left it
    step, tokens_seen, flops_seen, resumed_max_iters, wandb_id = run.resume(ckpt, ckpt_path, model, optimizer, rank,
                                                                            torch.device(device), log)
    del ckpt  # the copies live in the model and optimizer now
raw_model = model  # checkpoints hold its state_dict: no "_orig_mod." or "module." prefixes
# a small model on one GPU waits on ~300 kernel launches a step: CUDA graphs replay them as one (static shapes). DDP's
# gradient hooks cannot be captured, and a CPU has no graphs: there it is torch.compile's default mode
graphs = compile and cuda_graphs and device_type == "cuda" and not ddp
if compile:
    model = torch.compile(model, mode="reduce-overhead" if graphs else None)
if ddp and not fsdp:  # the only buffers are the RoPE tables, which never change: no broadcasts
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None, broadcast_buffers=False)

# the run's length and what it counts: FLOPs (flops.py), input tokens (unique data) and view positions (what
# complementary masking multiplies), and the peak FLOP/s that MFU divides by
flops_per_step = training_flops(config, model_type, rows_per_step)  # all processes together
if max_flops:  # a compute budget: the most steps that fit in it, and the LR schedule follows
    max_iters = budget_steps(max_flops, flops_per_step)
snapshot_steps = {max(1, round(max_iters / 2 ** k)) for k in range(1, snapshots)}  # halvings back from the end
tokens_per_step, positions_per_step = rows_per_step * block_size, rows_per_step * n_views * block_size
peak = Peak(torch.device(device), getattr(torch, dtype), world_size)  # every device's
log(run.describe(raw_model, settings, world_size, grad_accum, micro_batch, flops_per_step, max_iters, unigram, peak))
if resumed_max_iters not in (None, max_iters):
    log(f"note: the run was {resumed_max_iters} steps long and is now {max_iters}: the cosine schedule follows the new "
        f"length from step {step} on, so this run equals neither length run from scratch")
wandb_run = wandb.init(project=wandb_project, name=wandb_run_name or out_dir, config=settings, id=wandb_id,
                       resume="allow") if wandb and master else None
write_log = run.start_log(out_dir, step if init_from == "resume" else None, wandb_run) if master else lambda r: None
write_log({"step": step, "code": checkpoint.code_version(), "unigram_loss": round(unigram, 4), "max_iters": max_iters,
           "flops_per_step": flops_per_step, "tokens_per_step": tokens_per_step, "world_size": world_size,
           "positions_per_step": positions_per_step, "peak_flops_per_device": peak.per_device,
           "mask_ratio": n_predicted / block_size})
meter = run.Meter(peak, flops_per_step, tokens_per_step, positions_per_step, log, write_log)  # the steps between logs


def get_batch(split, index, rows):
    """Rows `rows` of batch `index` of `split` (a step's rows_per_step rows), on the device: the model's arguments,
    the tokens (in the model's ids) and its random inputs (model.draw()). Every row is a function of (seed, split,
    index, row), so any split of a batch over processes and micro-steps sees the same data, and a resumed run
    continues exactly. The seed changes the training data and the initial weights, nothing else."""
    # validation batches are the same for every seed (the default seed's), so val losses compare across seeds
    key = np.random.SeedSequence([seed if split == "train" else 1337, split == "val", index]).generate_state(2)
    idx = windows[split].sample(rows_per_step, key, rows)
    idx = idx if vocab_map is None else vocab_map[idx]
    draws = raw_model.draw(rows_per_step, block_size, generator=torch.Generator().manual_seed(int(key[1])))
    batch = [idx, *draws_of_rows(draws, rows, n_views)]
    if device_type == "cuda":
        batch = [t.pin_memory().to(device, non_blocking=True) for t in batch]
    return batch


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / warmup_iters
    progress = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (learning_rate - min_lr)


def metrics(loss, stats):
    """The loss and the model's stats as one tensor: summed on the device, read only when logging (no sync per step)."""
    return torch.stack([loss.detach().float(), *(v.float() for v in stats.values())])


def my_rows(micro):
    """This process's rows of a step's batch in micro-step `micro`."""
    first = (rank * grad_accum + micro) * micro_batch
    return slice(first, first + micro_batch)


@torch.no_grad()
def estimate_val_loss():
    """{"loss": mean, and each of the model's stats: mean} over eval_iters fixed validation batches, each split over
    processes and micro-steps as a training step is: neither batch_size nor the process count changes the data."""
    evaluated = raw_model if device_type == "cuda" else model  # on a GPU eval mode would compile and capture it again
    model.eval()
    total = 0
    for i in range(eval_iters):
        for micro in range(grad_accum):  # equal micro-batches: the mean of their means is the batch's mean
            with autocast:
                loss, stats = evaluated(*get_batch("val", i, my_rows(micro)))
            total = total + torch.cat([metrics(loss, stats), torch.ones(1, device=device)])
    if ddp:
        dist.all_reduce(total)
    model.train()
    return dict(zip(["loss", *stats], (total[:-1] / total[-1]).tolist()))


def run_record():
    """What a checkpoint or snapshot says of its run: the model, its vocabulary map, the settings, the code, how far."""
    return {"model_type": model_type, "model_args": asdict(config), "vocab_map": vocab_map, "config": settings,
            "code": checkpoint.code_version(), "step": step, "tokens": tokens_seen, "flops": flops_seen}


def save_checkpoint():
    """Gather every process's state and write out_dir/ckpt.pt (atomically: plumbing/checkpoint.py)."""
    state = checkpoint.run_state(raw_model, optimizer, torch.device(device))  # every process takes part
    if master:
        checkpoint.save_checkpoint(ckpt_path, {**state, **run_record(), "max_iters": max_iters,
                                               "wandb_id": wandb_run.id if wandb_run else None})
        log(f"saved checkpoint to {ckpt_path} (step {step})")


def evaluate(last):
    """The validation loss against the unigram baseline, the frozen probes (probe_interval), a snapshot (at
    snapshot_steps) and the checkpoint; a non-finite loss stops the run without saving."""
    val = estimate_val_loss()
    if not all(map(math.isfinite, val.values())):
        run.stop_non_finite(step, "the validation loss", val, ckpt_path, settings)
    total_loss = val.pop("loss")
    val_loss = val.pop("mlm_loss", total_loss)  # the masked-token loss, which the unigram baseline bounds
    record = {"step": step, "val_loss": round(val_loss, 4), "below_unigram": round(unigram - val_loss, 4),
              "tokens": tokens_seen, "flops": flops_seen, **{f"val_{k}": round(v, 4) for k, v in val.items()}}
    gap = unigram - val_loss
    line = (f"step {step}: val loss {val_loss:.4f}, {abs(gap):.3f} nats {'below' if gap >= 0 else 'above'} the "
            f"unigram baseline {unigram:.3f}" + "".join(f", {k} {v:.4f}" for k, v in val.items()))
    if probe_interval and step % probe_interval == 0:
        record["probe"] = run.probe_run(raw_model, vocab_map, settings, device, probe_group)
        line += f", probe {record['probe']}"
    log(line)
    write_log(record)
    if step in snapshot_steps:
        path = checkpoint.save_snapshot(out_dir, raw_model, {**run_record(), "val_loss": val_loss})
        log(f"saved snapshot to {path} (step {step})")
    if step > 0 and (checkpoint_evals or last):
        save_checkpoint()


signals = run.Signals(lambda: step, out_dir)  # Ctrl-C: one line; SIGTERM, SIGUSR1: save the step; exit 75

# -----------------------------------------------------------------------------
# training loop
model.train()
while True:
    last = step >= max_iters
    if step % eval_interval == 0 or last or step in snapshot_steps:
        with meter.paused():  # evaluation time is not training time
            evaluate(last)
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
        if graphs:  # a new replay may reuse the last one's outputs' memory: metrics() has copied them
            torch.compiler.cudagraph_mark_step_begin()
        with autocast:
            loss, stats = model(*batch)
        (loss / grad_accum).backward()
        meter.add(metrics(loss, stats) / grad_accum)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    meter.steps += 1
    tokens_seen += tokens_per_step
    flops_seen += flops_per_step

    if step % log_interval == 0 or step >= max_iters:
        meter.report(step, max_iters, lr, stats, tokens_seen, flops_seen,
                     stop=lambda loss: run.stop_non_finite(step, "the training loss", loss, ckpt_path, settings))
    if step < max_iters and signals.stop_now(step % log_interval == 0, device):  # the last step goes on as usual
        save_checkpoint()
        break

if step >= max_iters:
    log(f"done: {step} steps, {tokens_seen:,} tokens, {flops_seen:.2e} FLOPs; checkpoint at {ckpt_path}")
if wandb_run:
    wandb_run.finish()
del model, raw_model, optimizer  # they hold the process group, which exit() leaves
signals.exit(stopped=step < max_iters)
