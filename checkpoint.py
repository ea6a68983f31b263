"""
Checkpoint files, and the training runs that write and resume them: train.py writes them, the evaluation scripts and
the experiments read them.

A checkpoint is a dict holding the weights (model), model_type and model_args (the ModelConfig as a dict),
and what train.py adds to resume a run exactly: the optimizer state, the run settings, the step, tokens and
FLOPs so far, and every process's RNG state. Weights and optimizer state are full (unsharded) state dicts keyed by
parameter name, so any script reads any run's checkpoint, and a run resumes with or without FSDP.

For train.py: check_run() checks a run's settings against each other, the machine, its out_dir and the checkpoint it
resumes, before anything is built or written; run_state() and restore() move a run's state in and out of a
checkpoint; start_log() opens its log.
"""
import functools
import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from errors import UserError, at_least, check_device, check_writable
from data.tasks import GLUE, load_task
from model import MODELS, ModelConfig, make_config

# settings a resumed run may change; any other difference would break "resume continues exactly"
RESUMABLE = {"init_from", "out_dir", "max_iters", "max_flops", "eval_interval", "eval_iters", "log_interval",
             "probe_interval", "probe_tasks", "probe_glue_dir", "probe_max_train", "compile", "device", "batch_size",
             "fsdp", "overwrite", "join_timeout", "snapshots", "wandb_log", "wandb_project", "wandb_run_name"}

# checkpoints written before the block's parts were settings hold this block (a plain GELU MLP, nothing else)
BLOCK_BEFORE = dict(mlp="gelu", emb_norm=False, lm_head=False, decoder_bias=False)


@functools.lru_cache(maxsize=None)
def code_version():
    """The code a result comes from, recorded in every checkpoint and log so that a number can be tied to it:
    {"commit": git's HEAD, "dirty": whether tracked files differ from it} in a git checkout, else (a copy without
    .git) {"sha256": a hash of the root .py files, the code that trains and evaluates}."""
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        git = lambda *args: subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10,
                                           check=True).stdout.strip()
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        digest = hashlib.sha256()
        for path in sorted(glob.glob(os.path.join(root, "*.py"))):
            digest.update(os.path.basename(path).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
        return {"sha256": digest.hexdigest()}


def save_checkpoint(path, ckpt):
    """Write the dict ckpt to path atomically: a crash mid-write leaves the previous checkpoint intact, and a Ctrl-C
    mid-write is held until the new file is in place (then raised), so an interrupt never loses the step."""
    tmp = f"{path}.tmp"
    interrupted = []
    hold = threading.current_thread() is threading.main_thread()  # only the main thread may set signal handlers
    if hold:
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    try:
        with open(tmp, "wb") as f:  # opened here, so a path or disk problem is an OSError (torch.save's own is not)
            torch.save(ckpt, f)
        os.replace(tmp, path)
    except BaseException as e:  # no half-written file is left behind
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a failed write does not name its file
            e.filename = tmp
        raise
    finally:
        if hold:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if interrupted:
        raise KeyboardInterrupt


def read_checkpoint(path, device="cpu"):
    """The checkpoint dict at path, checked: a missing, empty, truncated or foreign file, or non-finite weights,
    is a UserError that names the problem and the fix."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such checkpoint; train one with `python train.py` or check the path")
    if os.path.getsize(path) == 0:
        raise UserError(f"{path} is empty (0 bytes): a copy or a disk went wrong; restore it or train again")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise UserError(f"{path} is truncated or not a checkpoint written by train.py ({type(e).__name__}); "
                        "pass the ckpt.pt from a training run's out_dir") from None
    if not isinstance(ckpt, dict) or not {"model", "model_type", "model_args"} <= ckpt.keys():
        raise UserError(f"{path} is not a checkpoint written by train.py (no model/model_type/model_args); "
                        "pass the ckpt.pt from a training run's out_dir")
    ckpt["model_args"] = {**BLOCK_BEFORE, **ckpt["model_args"]}
    bad = [k for k, v in ckpt["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise UserError(f"{path} holds non-finite weights ({', '.join(bad[:3])}): it is corrupted or its run "
                        "diverged; restore it or resume from an earlier checkpoint")
    return ckpt


def load_checkpoint(path, device="cpu"):
    """(model in eval mode, checkpoint dict) from a checkpoint file written by train.py."""
    ckpt = read_checkpoint(path, device)
    # older checkpoints have model_type at the top level only, not in model_args
    config = ModelConfig(**{**ckpt["model_args"], "model_type": ckpt["model_type"]})
    model = MODELS[config.model_type](config)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt


# -----------------------------------------------------------------------------
# Training runs (train.py)

def check_run(s, world_size):
    """(ModelConfig, the checkpoint to resume or None) of train.py's settings s on world_size processes, once every
    setting has been checked, before anything is built or written: a bad one is a UserError that names it and the
    fix. The checkpoint is read to the CPU, and only if the run continues it exactly (RESUMABLE)."""
    at_least(s, 1, ("batch_size", "total_batch_size", "max_iters", "eval_interval", "eval_iters", "log_interval"))
    at_least(s, 0, ("warmup_iters", "max_flops", "grad_clip", "weight_decay", "min_lr", "probe_interval", "dropout",
                    "rtd_weight", "join_timeout", "snapshots"))
    if not (s["learning_rate"] > 0 and 0 <= s["beta1"] < 1 and 0 <= s["beta2"] < 1 and s["dropout"] < 1):
        raise UserError("learning_rate must be > 0, and beta1, beta2 and dropout in [0, 1)")
    check_device(s["device"], s["dtype"])
    if s["init_from"] not in ("scratch", "resume"):
        raise UserError(f"init_from={s['init_from']!r}: expected scratch or resume")
    if s["fsdp"] and world_size == 1:
        raise UserError("fsdp=True shards over processes: launch with torchrun --nproc_per_node=N (N > 1), or drop fsdp")
    total, quantum = s["total_batch_size"], s["block_size"] * world_size  # a step's rows split evenly over processes
    if total % quantum or total < quantum:
        lo = max(quantum, total // quantum * quantum)
        raise UserError(f"total_batch_size={total} must be a multiple of block_size x processes = {s['block_size']} x "
                        f"{world_size} = {quantum}; the nearest values that work are {lo} and {lo + quantum}")
    try:  # local probe tasks are read now, so a bad one stops the run before it starts (the hub's: at step 0)
        for task in s["probe_tasks"].split(",") if s["probe_interval"] else ():
            if s["probe_glue_dir"] or task.upper() not in map(str.upper, GLUE):
                load_task(task, s["probe_glue_dir"] or None, s["probe_max_train"])
    except UserError as e:
        raise UserError(f"probe_tasks: {e}") from None
    try:  # the model's shape, masking and vocabulary, checked by ModelConfig (with the model's defaults filled in)
        config = make_config(s)
    except ValueError as e:
        raise UserError(str(e)) from None
    check_writable(s["out_dir"], "out_dir")
    path = os.path.join(s["out_dir"], "ckpt.pt")
    if s["init_from"] == "scratch":
        if os.path.exists(path) and not s["overwrite"]:
            raise UserError(f"{s['out_dir']} already holds a checkpoint ({path}); resume it with --init_from=resume, pick "
                            "another --out_dir, or pass --overwrite=True to replace it")
        return config, None
    if not os.path.exists(path):
        raise UserError(f"init_from=resume: no checkpoint at {path}; check out_dir or start with init_from=scratch")
    try:
        ckpt = read_checkpoint(path)
    except ValueError as e:
        raise UserError(f"{e} (or start over: --init_from=scratch --overwrite=True)") from None
    if ckpt["model_type"] != s["model_type"]:
        raise UserError(f"{path} holds a {ckpt['model_type']} model but model_type={s['model_type']}; "
                        f"pass --model_type={ckpt['model_type']} or use another out_dir")
    now = asdict(config)
    diff = {k: (v, now.get(k)) for k, v in ckpt["model_args"].items() if now.get(k) != v}
    if diff:
        raise UserError(f"{path} was trained with a different model config (checkpoint vs now): {diff}; "
                        "pass the checkpoint's settings or use another out_dir")
    diff = {k: (v, s.get(k)) for k, v in ckpt["config"].items() if k not in RESUMABLE and s.get(k) != v}
    if diff:
        raise UserError(f"{path} was trained with different settings (checkpoint vs now): {diff}; a resumed run "
                        "continues exactly only with the same ones: pass them, or use another out_dir")
    return config, ckpt


def reach_master(seconds):
    """A process of a multi-process run launched with MASTER_ADDR and MASTER_PORT (torchrun's workers, or a
    scheduler's): wait until the master's address answers, for at most `seconds` (the master may start later), then
    raise a UserError that names the address and the fix, rather than block in init_process_group for 30 minutes."""
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((addr, port), timeout=5).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise UserError(f"rank {os.environ.get('RANK')} cannot reach the master at {addr}:{port} after "
                                f"{seconds:g}s ({e.strerror or e}); start node rank 0 too, check --master_addr and "
                                "--master_port, and that the port is open between the nodes (join_timeout sets the "
                                "wait)") from None
            time.sleep(1)


def full_state_options():
    """Full (unsharded) state dicts on the CPU: FSDP's shards are gathered, on every process (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # imported here: it is slow, and only
    return StateDictOptions(full_state_dict=True, cpu_offload=True)          # training needs it


def model_state(model):
    """The model's full state dict on the CPU; every process calls it (gathering FSDP's shards is a collective)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return get_model_state_dict(model, options=full_state_options())


def run_state(model, optimizer, device):
    """A run's state, for its checkpoint: the model's and optimizer's full state dicts and every process's RNG
    state (dropout's; the data has its own). Every process calls it; only rank 0's copy is complete."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    rng = [torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()]
    if dist.is_initialized():  # every rank's dropout stream, so a resume continues each exactly
        mine = rng[0].to(device)  # nccl gathers GPU tensors only
        rng = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(rng, mine)
        rng = [r.cpu() for r in rng]
    return {"model": model_state(model), "rng": rng, "rng_device": device.type,
            "optimizer": get_optimizer_state_dict(model, optimizer, options=full_state_options())}


def restore(ckpt, model, optimizer, rank, device):
    """Copy a checkpoint's state into the model (sharded or not), the optimizer and this process's RNG; False when the
    RNG state is another device type's (CUDA and CPU generator states do not convert), so dropout starts afresh."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    set_model_state_dict(model, ckpt["model"], options=full_state_options())
    set_optimizer_state_dict(model, optimizer, ckpt["optimizer"], options=full_state_options())
    if ckpt.get("rng_device", device.type) != device.type:
        return False
    state = ckpt["rng"][rank % len(ckpt["rng"])].cpu()
    torch.cuda.set_rng_state(state, device) if device.type == "cuda" else torch.set_rng_state(state)
    return True


def start_log(out_dir, resumed_step=None):
    """A run's out_dir/log.jsonl, open for appending. A scratch run starts it empty, so that records never mix across
    runs, and first removes the checkpoint it replaces (overwrite=True), so that a crash before its first save cannot
    leave the old checkpoint beside the new log. A resumed run keeps the records before resumed_step (and that step's
    training record), the ones it will not write again. The records kept are written whole, then renamed."""
    os.makedirs(out_dir, exist_ok=True)
    path, kept = os.path.join(out_dir, "log.jsonl"), []
    if resumed_step is None and os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        os.remove(os.path.join(out_dir, "ckpt.pt"))
    if resumed_step is not None and os.path.exists(path):
        with open(path) as f:
            kept = [r for r in map(json.loads, f) if r["step"] < resumed_step or (r["step"] == resumed_step
                                                                                  and "loss" in r)]
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(path + ".tmp", path)
    return open(path, "a")
