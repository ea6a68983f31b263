"""
Checkpoint files: train.py writes them, the evaluation scripts and the experiments read them.

A checkpoint is a dict holding the weights (model), model_type and model_args (the ModelConfig as a dict),
and what train.py adds to resume a run exactly: the optimizer state, the run settings, the step, tokens and
FLOPs so far, and every process's RNG state. Weights and optimizer state are full (unsharded) state dicts keyed by
parameter name, so any script reads any run's checkpoint, and a run resumes with or without FSDP. Writes are atomic.
"""
import functools
from dataclasses import fields
import glob
import hashlib
import os
import signal
import subprocess
import threading

import torch
import torch.distributed as dist

from configurator import UserError
from model import MODELS, ModelConfig

# the block switches of checkpoints from before the block was fixed, at today's block; earlier blocks load with the code
# of commit 5bd5a8c, the last that had them
FIXED_BLOCK = dict(mlp="geglu", emb_norm=True, lm_head=True, decoder_bias=True, rope_base=10000.0)


@functools.lru_cache(maxsize=None)
def code_version():
    """The code a result comes from, recorded in every checkpoint and log so that a number can be tied to it:
    {"commit": git's HEAD, "dirty": whether tracked files differ from it} in a git checkout, else (a copy without
    .git) {"sha256": a hash of the root .py files, the code that trains and evaluates}."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    if "vocab_map" not in ckpt:  # written before the block was fixed and the vocabulary map left the model
        args = ckpt["model_args"]
        if "mlp" not in args or any(args.get(k, v) != v for k, v in FIXED_BLOCK.items()):
            block = ", ".join(f"{k}={args.get(k)}" for k in FIXED_BLOCK)
            raise UserError(f"{path} holds a model of an earlier block ({block}); read it with the code of commit "
                            "5bd5a8c (git checkout 5bd5a8c)")
        names = {f.name for f in fields(ModelConfig)}
        ckpt["model_args"] = {k: v for k, v in args.items() if k in names}
        ckpt["vocab_map"] = ckpt["model"].pop("vocab_map", None)
    bad = [k for k, v in ckpt["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise UserError(f"{path} holds non-finite weights ({', '.join(bad[:3])}): it is corrupted or its run "
                        "diverged; restore it or resume from an earlier checkpoint")
    return ckpt


def load_checkpoint(path, device="cpu"):
    """(model in eval mode, checkpoint dict) from a checkpoint file written by train.py; the dict's vocab_map is the
    map from GPT-2 ids to the model's (None: the same ids), which the data was read through."""
    ckpt = read_checkpoint(path, device)
    # older checkpoints have model_type at the top level only, not in model_args
    config = ModelConfig(**{**ckpt["model_args"], "model_type": ckpt["model_type"]})
    model = MODELS[config.model_type](config)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt


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


def save_snapshot(out_dir, model, record):
    """The model's weights alone, with `record` (its run, step and val loss): out_dir/snapshots/stepNNNNNN.pt, read like
    a checkpoint by load_checkpoint and probe.py (no optimizer state: a point to probe, not to resume). Every process
    calls it (FSDP gathers its shards); rank 0 writes it, and returns its path."""
    state = model_state(model)
    if dist.is_initialized() and dist.get_rank() > 0:
        return None
    path = os.path.join(out_dir, "snapshots", f"step{record['step']:06d}.pt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_checkpoint(path, {"model": state, **record})
    return path
