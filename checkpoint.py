"""
Checkpoint files, and the training runs that write and resume them: train.py writes them, the evaluation scripts and
the experiments read them.

A checkpoint is a dict holding the weights (model), model_type and model_args (the ModelConfig as a dict),
and what train.py adds to resume a run exactly: the optimizer state, the run settings, the step, tokens and
FLOPs so far, and every process's RNG state. Weights and optimizer state are full (unsharded) state dicts keyed by
parameter name, so any script reads any run's checkpoint, and a run resumes with or without FSDP.

For train.py: check_run() checks a run's settings against each other, the machine, its out_dir and the checkpoint it
resumes, before anything is built or written; run_state() and restore() move a run's state in and out of a
checkpoint, and save_snapshot() keeps its weights along the way; start_log() opens its log; probe_run() runs its
frozen probes; Signals ends it cleanly: Ctrl-C in one line, and a cluster's preemption (SIGTERM, SIGUSR1) with the
step in flight saved and exit status PREEMPTED, after which --init_from=resume continues it exactly.
"""
import functools
import gc
import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from data.tasks import GLUE, load_task
from errors import UserError, at_least, check_device, check_writable, interrupt_hook
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


def stop_non_finite(step, what, value, ckpt_path, s):
    """Stop a run whose loss (`what`) is not finite, saving nothing: the last checkpoint holds finite weights."""
    saved = f"resume from {ckpt_path} (--init_from=resume)" if os.path.exists(ckpt_path) else "no checkpoint was written"
    raise UserError(f"step {step}: {what} is {value}; stopping without saving. {saved}, and try a lower learning_rate "
                    f"(now {s['learning_rate']}), a lower init_std (now {s['init_std']}), or grad_clip")


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


def start_log(out_dir, resumed_step=None, wandb_run=None):
    """write(record): a run's records, one JSON object a line appended to out_dir/log.jsonl, and sent live to wandb_run
    (at the record's step) if given. A scratch run starts the log empty, so that records never mix across runs, and
    first removes the checkpoint it replaces (overwrite=True), so that a crash before its first save cannot leave the
    old checkpoint beside the new log. A resumed run keeps the records before resumed_step (and that step's training
    record), the ones it will not write again. The records kept are written whole, then renamed."""
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
    log = open(path, "a")

    def write(record):
        log.write(json.dumps(record) + "\n")
        log.flush()
        if wandb_run:
            wandb_run.log(record, step=record["step"])
    return write


def probe_run(probe, model, s, device, group):
    """The frozen probes of a run's model, the paper's monitor: probe.probe_tasks (passed in, since probe.py imports
    this module through features.py) with train.py's settings s (probe_tasks, probe_glue_dir, probe_max_train), on
    rank 0, whose scores it returns (None elsewhere). Every process calls it; the others wait in `group`, a group with
    a long timeout, since a probe may take longer than the default group's (10-30 min), which would end the run in
    whatever collective they waited in instead. A sharded model (FSDP) cannot run on one process alone: rank 0 probes
    an unsharded copy."""
    master = not dist.is_initialized() or dist.get_rank() == 0
    if s["fsdp"]:
        state = model_state(model)
        if master:
            model = type(model)(model.config).to(device)
            model.load_state_dict(state)
    scores = probe(model, s["probe_tasks"], s["probe_glue_dir"] or None, s["probe_max_train"]) if master else None
    if dist.is_initialized():
        dist.barrier(group=group)
    return scores


# -----------------------------------------------------------------------------
# How a run ends: finished, interrupted (Ctrl-C) or preempted (SIGTERM, SIGUSR1)

PREEMPTED = 75  # EX_TEMPFAIL (sysexits.h): not done and not failed, "try again": a job script can tell it from a
                # finished run (0), a crash (1) and bad input (2), and requeue the same command with --init_from=resume
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Signals:
    """A training run's signal handling, from its creation to exit(). Ctrl-C ends the run in one line naming the
    checkpoint to resume from (a Ctrl-C mid-save is held until the file is whole: save_checkpoint).

    Preemption: a cluster ends a job with SIGTERM, or first with a signal it was told to send (SLURM:
    --signal=USR1@120). The handler only notes the signal and the step it came after (step(), the run's current
    step); the run finishes the step it is in, asks stop_now(), saves a checkpoint and calls exit(), which exits with
    PREEMPTED. A second signal during the save is noted and nothing more (the write is atomic anyway, and holds
    Ctrl-C), so nothing can be left half-written."""

    def __init__(self, step, out_dir):
        self.step, self.ckpt_path = step, os.path.join(out_dir, "ckpt.pt")
        self.came = None  # (the signal's name, the step it came after)
        interrupt_hook("train.py", lambda: f"interrupted at step {step()}; " + (
            f"the last checkpoint is {self.ckpt_path}; continue with --init_from=resume --out_dir={out_dir}"
            if os.path.exists(self.ckpt_path) else "no checkpoint was written yet"))
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.note)
            signal.siginterrupt(sig, False)  # a system call it interrupts restarts, as a collective's socket reads must

    def note(self, signum, frame):
        self.came = self.came or (signal.Signals(signum).name, self.step())

    def stop_now(self, log_point, device):
        """Whether to stop now for a signal, with the same answer on every process. One process reads its flag, a
        Python variable, every step: no sync. On torchrun a signal reaches the processes at different steps (or only
        some of them), but all must stop at the same step, since saving is a collective: they agree with one
        all_reduce of their flags at each log point (log_point: this step is one), where the loss is read anyway, and
        never in between, so no step waits on the others or on the device for it. The cost: a signal stops them up to
        log_interval steps later."""
        if not dist.is_initialized():
            return self.came is not None
        if not log_point:
            return False
        flag = torch.tensor(self.came is not None, dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag)

    def exit(self, stopped):
        """End the process once all is saved: after a stop (stopped), rank 0 says in one line what came, where the run
        stopped and how to continue it, and every process exits with PREEMPTED; after a finished run, with 0. The
        caller drops what holds the process group first (the model, the optimizer)."""
        if stopped and (not dist.is_initialized() or dist.get_rank() == 0):
            why = f"{self.came[0]} came after step {self.came[1]}" if self.came else "another process was signalled"
            print(f"train.py: {why}; stopped at step {self.step()} and saved {self.ckpt_path}; continue with the same "
                  f"settings and --init_from=resume (exit status {PREEMPTED})", file=sys.stderr, flush=True)
        if dist.is_initialized():
            # free what holds the process group (DDP/FSDP state, the optimizer) while the interpreter is alive, then
            # leave together: a gloo group left for interpreter exit to destroy can abort with "terminate called
            # without an active exception" after the run has finished
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()
        # all is saved and the process group is gone: a signal has nothing left to stop. Ignored, it cannot change the
        # exit status: torchrun signals the processes still exiting once one has exited, and Python, shutting down,
        # would restore the default handlers, which end a process by the signal
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        sys.exit(PREEMPTED if stopped else 0)
