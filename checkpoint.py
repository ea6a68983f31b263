"""
Checkpoint files: train.py writes them, the evaluation scripts and sweep.py read them.

A checkpoint is a dict holding the weights (model), model_type and model_args (the ModelConfig as a dict),
and what train.py adds to resume a run exactly: the optimizer state, the run settings, the step, tokens and
FLOPs so far, and every process's RNG state.
"""
import os
import signal
import threading

import torch

from model import MODELS, ModelConfig

# checkpoints written before the block's parts were settings hold this block (a plain GELU MLP, nothing else)
BLOCK_BEFORE = dict(mlp="gelu", emb_norm=False, lm_head=False, decoder_bias=False)


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
    is a ValueError that names the problem and the fix."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such checkpoint; train one with `python train.py` or check the path")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty (0 bytes): a copy or a disk went wrong; restore it or train again")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} is truncated or not a checkpoint written by train.py ({type(e).__name__}); "
                         "pass the ckpt.pt from a training run's out_dir") from None
    if not isinstance(ckpt, dict) or not {"model", "model_type", "model_args"} <= ckpt.keys():
        raise ValueError(f"{path} is not a checkpoint written by train.py (no model/model_type/model_args); "
                         "pass the ckpt.pt from a training run's out_dir")
    ckpt["model_args"] = {**BLOCK_BEFORE, **ckpt["model_args"]}
    bad = [k for k, v in ckpt["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{path} holds non-finite weights ({', '.join(bad[:3])}): it is corrupted or its run "
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
