"""
A training run's plumbing, for train.py: its settings checked before anything is built or written (check_run), the
wait for the master of a multi-node run, its log (and wandb), its frozen probes, a stop on a non-finite loss, and its
end: Ctrl-C in one line, and a cluster's preemption (SIGTERM, SIGUSR1) with the step in flight saved and exit status
PREEMPTED, after which --init_from=resume continues it exactly.
"""
import gc
import json
import math
import os
import signal
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict

import torch
import torch.distributed as dist

from configurator import UserError, make_config
from data.tasks import GLUE, load_task
from plumbing.checkpoint import model_state, read_checkpoint, restore
from plumbing.checks import at_least, check_device, check_writable

# settings a resumed run may change; any other difference would break "resume continues exactly"
RESUMABLE = {"init_from", "out_dir", "max_iters", "max_flops", "eval_interval", "eval_iters", "log_interval",
             "probe_interval", "probe_tasks", "probe_glue_dir", "probe_max_train", "compile", "device", "batch_size",
             "fsdp", "overwrite", "join_timeout", "snapshots", "wandb_log", "wandb_project", "wandb_run_name"}


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
        raise UserError("fsdp=True shards over processes: launch with torchrun --nproc_per_node=N (N > 1), or "
                        "drop fsdp")
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
            raise UserError(f"{s['out_dir']} already holds a checkpoint ({path}); resume it with --init_from=resume, "
                            "pick another --out_dir, or pass --overwrite=True to replace it")
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


def probe_run(model, vocab_map, s, device, group):
    """The frozen probes of a run's model (with its vocabulary map), the paper's monitor: probe.probe_tasks with
    train.py's settings s (probe_tasks, probe_glue_dir, probe_max_train), on rank 0, whose scores it returns (None
    elsewhere). Every process calls it; the others wait in `group`, a group with a long timeout, since a probe may take
    longer than the default group's (10-30 min), which would end the run in whatever collective they waited in
    instead. A sharded model (FSDP) cannot run on one process alone: rank 0 probes an unsharded copy."""
    from evaluation.features import Backbone  # imported only by a run that probes
    from probe import probe_tasks
    master = not dist.is_initialized() or dist.get_rank() == 0
    if s["fsdp"]:
        state = model_state(model)
        if master:
            model = type(model)(model.config).to(device)
            model.load_state_dict(state)
    scores = probe_tasks(Backbone(model, vocab_map), s["probe_tasks"], s["probe_glue_dir"] or None,
                         s["probe_max_train"]) if master else None
    if dist.is_initialized():
        dist.barrier(group=group)
    return scores


def init_processes(device, rank, local_rank, join_timeout):
    """A torchrun process's device (its GPU, cuda:LOCAL_RANK) and process group; ranks above 0 first wait for the
    master's address to answer (reach_master). Returns the device."""
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    if rank > 0:
        reach_master(join_timeout)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return device


def describe(model, s, world_size, grad_accum, micro_batch, flops_per_step, max_iters, unigram, peak):
    """The lines a run starts its log with: the model, the batch and budget (and a note where max_flops overrode the
    max_iters setting), the peak MFU divides by, the unigram baseline."""
    V, _, M = model.config.views
    T = s["block_size"]
    budget = (f"note: max_flops={s['max_flops']:.3g} sets the run's length: {max_iters} steps, not the max_iters "
              f"setting's {s['max_iters']}\n" if s["max_flops"] and s["max_iters"] != max_iters else "")
    return budget + (f"{s['model_type']}: {model.num_params() / 1e6:.2f}M parameters ({model.num_params(True) / 1e6:.2f}M "
            f"non-embedding), vocabulary {model.config.vocab_size}, mask ratio {M / T:.4g}, {V} view(s) per row, "
            f"{V * M} of {T} positions predicted per row\n"
            f"{world_size} process(es) x {grad_accum} micro-step(s) x {micro_batch} rows x {T} tokens = "
            f"{s['total_batch_size']} tokens per step; {flops_per_step / 1e9:.2f} GFLOPs per step; {max_iters} steps = "
            f"{max_iters * flops_per_step:.2e} FLOPs; device {s['device']}, {s['dtype']}\n"
            f"MFU is against a peak of {peak.per_device:.3g} FLOP/s per device "
            f"({'its datasheet' if peak.from_table else 'the best of 10 matmuls'})\n"
            f"unigram baseline: a model that ignores context scores {unigram:.4f} nats on val")


def stop_non_finite(step, what, value, ckpt_path, s):
    """Stop a run whose loss (`what`) is not finite, saving nothing: the last checkpoint holds finite weights."""
    saved = (f"resume from {ckpt_path} (--init_from=resume)" if os.path.exists(ckpt_path)
             else "no checkpoint was written")
    raise UserError(f"step {step}: {what} is {value}; stopping without saving. {saved}, and try a lower learning_rate "
                    f"(now {s['learning_rate']}), a lower init_std (now {s['init_std']}), or grad_clip")


class Meter:
    """A run's training steps between two log points: the loss and the model's stats (train.py's metrics(): summed on
    the device and read only at a log point, so no step waits for a sync) and the time spent training (evaluations
    excluded); report() turns them into the record and line to log: throughput in input tokens and view positions, and
    MFU against the peak (measured again when the run beats it: it was measured on a busy machine)."""

    def __init__(self, peak, flops_per_step, tokens_per_step, positions_per_step, log, write_log):
        self.peak, self.flops, self.tokens, self.positions = peak, flops_per_step, tokens_per_step, positions_per_step
        self.log, self.write_log = log, write_log
        self.total, self.steps, self.t0 = 0, 0, time.perf_counter()

    def add(self, metrics):
        self.total = self.total + metrics

    @contextmanager
    def paused(self):  # what runs inside is not training time
        t = time.perf_counter()
        yield
        self.t0 += time.perf_counter() - t

    def report(self, step, max_iters, lr, names, tokens, flops, stop):
        """Log the mean loss and stats (`names`) of the steps since the last report; stop(loss) if it is not finite."""
        if dist.is_initialized():
            dist.all_reduce(self.total, op=dist.ReduceOp.AVG)
        train_loss, *parts = (self.total / self.steps).tolist()
        if not math.isfinite(train_loss):
            stop(train_loss)
        dt, parts = (time.perf_counter() - self.t0) / self.steps, dict(zip(names, parts))
        if self.peak.measure_again(self.flops / dt):
            self.log(f"note: this run beat the matmul peak measured at its start; peak now {self.peak.per_device:.3g} "
                     "FLOP/s per device (measured again, and at least what the run achieved)")
            self.write_log({"step": step, "peak_flops_per_device": self.peak.per_device})
        r = {"step": step, "loss": round(train_loss, 4), "lr": lr, **{k: round(v, 4) for k, v in parts.items()},
             "input_tokens_per_s": round(self.tokens / dt), "view_positions_per_s": round(self.positions / dt),
             "mfu": round(self.flops / dt / self.peak.flops, 4), "tokens": tokens, "flops": flops,
             "ms_per_step": round(1000 * dt, 1)}
        shown = f" ({', '.join(f'{k} {v:.4f}' for k, v in parts.items())})" if parts else ""
        self.log(f"step {step}/{max_iters}: loss {train_loss:.4f}{shown}, lr {lr:.2e}, {r['input_tokens_per_s']} "
                 f"input tok/s ({r['view_positions_per_s']} view positions/s), MFU {100 * r['mfu']:.1f}%, "
                 f"{1000 * dt:.0f} ms/step, {flops:.2e} FLOPs")
        self.write_log(r)
        self.total, self.steps, self.t0 = 0, 0, time.perf_counter()


def resume(ckpt, path, model, optimizer, rank, device, log):
    """Copy the checkpoint ckpt (read from path) into a run: its weights, optimizer and RNG states (restore). Returns
    its (step, tokens, FLOPs, length, wandb run id), where the resumed run goes on."""
    if not restore(ckpt, model, optimizer, rank, device):  # only dropout draws from the RNG
        exact = (", so the run is no longer exact" if ckpt["model_args"]["dropout"]
                 else " (dropout is 0: nothing changes)")
        log(f"note: {path} holds {ckpt['rng_device']} RNG states and this run is on {device.type}: dropout draws a "
            f"fresh stream{exact}")
    log(f"resumed from {path} at step {ckpt['step']}")
    return ckpt["step"], ckpt["tokens"], ckpt["flops"], ckpt.get("max_iters"), ckpt.get("wandb_id")


def shard(model):
    """FSDP2: each block's parameters, gradients and optimizer state sharded over the processes."""
    from torch.distributed.fsdp import fully_shard
    for block in [*model.blocks, *getattr(model, "predictor", []), *getattr(model, "generator", [])]:
        fully_shard(block)
    fully_shard(model)


# -----------------------------------------------------------------------------
# How a run ends: finished, interrupted (Ctrl-C) or preempted (SIGTERM, SIGUSR1)

def interrupt_hook(script, where):
    """Ctrl-C ends in one line, `<script>: <where()>` (what was saved, and how to go on), with no traceback. Other
    exceptions go on to the hook that was there before."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(f"{script}: {where()}", file=sys.stderr)
    sys.excepthook = hook


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
