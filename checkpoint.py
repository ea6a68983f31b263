"""
Checkpoint files: train.py writes them, the evaluation scripts and sweep.py read them.

A checkpoint is a dict holding the weights (model), model_type and model_args (the ModelConfig as a dict),
and what train.py adds to resume a run exactly: the optimizer state, the run settings, the step, tokens and
FLOPs so far, and every process's RNG state.
"""
import os

import torch

from model import MODELS, ModelConfig


def save_checkpoint(path, ckpt):
    """Write the dict ckpt to path atomically: a crash mid-write leaves the previous checkpoint intact."""
    tmp = f"{path}.tmp"
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, device="cpu"):
    """(model in eval mode, checkpoint dict) from a checkpoint file written by train.py."""
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such checkpoint; train one with `python train.py` or check the path") from None
    except Exception as e:
        raise ValueError(f"{path} is not a checkpoint written by train.py ({type(e).__name__}); "
                         "pass the ckpt.pt from a training run's out_dir") from None
    if not isinstance(ckpt, dict) or not {"model", "model_type", "model_args"} <= ckpt.keys():
        raise ValueError(f"{path} is not a checkpoint written by train.py (no model/model_type/model_args); "
                         "pass the ckpt.pt from a training run's out_dir")
    # older checkpoints have model_type at the top level only, not in model_args
    config = ModelConfig(**{**ckpt["model_args"], "model_type": ckpt["model_type"]})
    model = MODELS[config.model_type](config)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt
