"""
What the frozen evaluators share (probe.py, embeddings/, sample.py, hf/export.py): the settings that pick the backbone,
a checkpoint or a random-init baseline; GPT-2 token ids of sentences and of pairs; pooled features by layer, batched by
length. Library code: it raises UserError, never exits.
"""
import sys

import numpy as np
import torch
import torch.nn as nn
from tqdm import tqdm

from configurator import UserError, make_config
from data.tokenizer import EOT, PAD, encode_batch
from model import MODELS, ModelConfig
from plumbing.checkpoint import code_version, load_checkpoint
from plumbing.checks import check_device


def mean_pool(h, mask):
    """Average of the token states h (B, T, C) over the real tokens (mask True), in float32."""
    m = mask.unsqueeze(-1).float()
    return (h.float() * m).sum(1) / m.sum(1)


# the settings that pick the backbone, first among probe.py's and embed.py's (configurator.py reads the comments); a
# --ckpt=random baseline's shape defaults to ModelConfig's
MODEL_SETTINGS = dict(
    ckpt="out/ckpt.pt",                  # a train.py checkpoint, or random (an untrained baseline)
    like="",                             # with --ckpt=random: the random twin of this checkpoint (its shape and
                                         # vocabulary map, fresh weights), the baseline a trained checkpoint must beat
    model_type=ModelConfig.model_type,   # with --ckpt=random and no --like: bert | crossbert | electra, of this shape:
    n_layer=ModelConfig.n_layer,         # its encoder depth
    n_head=ModelConfig.n_head,           # its attention heads
    n_embd=ModelConfig.n_embd,           # its width
    block_size=ModelConfig.block_size,   # its longest sequence
    seed=1337,                           # the random baseline's weights, and the seeded subsets and shuffles
    device="cuda" if torch.cuda.is_available() else "cpu",  # cpu, cuda or cuda:N
)


def check_model_settings(s):
    """A UserError for MODEL_SETTINGS no run can use, before any data or checkpoint is read."""
    check_device(s["device"])
    if s["model_type"] not in MODELS:
        raise UserError(f"--model_type={s['model_type']!r}: expected one of {', '.join(sorted(MODELS))}")
    if s["like"] and s["ckpt"] != "random":
        raise UserError(f"--like={s['like']} makes a random twin: pass it with --ckpt=random")
    if s["ckpt"] == "random" and not s["like"]:
        try:
            make_config(s)
        except ValueError as e:  # a shape no model can have
            raise UserError(str(e)) from None


class Backbone(nn.Module):
    """A model and the vocabulary map its data was read through: encode() takes GPT-2 ids (<pad> included), as the
    evaluators tokenise, and ids() maps them to the model's (a compact vocabulary sends rare ids to <unk>)."""

    def __init__(self, model, vocab_map=None):
        super().__init__()
        self.model, self.config = model, model.config
        self.register_buffer("vocab_map", None if vocab_map is None else torch.as_tensor(vocab_map).long(),
                             persistent=False)

    def ids(self, idx):
        return idx if self.vocab_map is None else self.vocab_map.to(idx.device)[idx]

    def encode(self, idx, attention_mask=None, layers=None):
        return self.model.encode(self.ids(idx), attention_mask, layers)


def load_backbone(path, device="cpu"):
    """(Backbone in eval mode, checkpoint dict) of a checkpoint file written by train.py."""
    model, ckpt = load_checkpoint(path, device)
    return Backbone(model, ckpt["vocab_map"]).to(device).eval(), ckpt


def random_twin(backbone, seed=0):
    """The baseline a trained backbone must beat: the same shape and vocabulary map, on its device, with fresh random
    weights (a compact vocabulary sends rare ids to <unk> for both)."""
    torch.manual_seed(seed)
    twin = type(backbone.model)(backbone.config)
    return Backbone(twin, backbone.vocab_map).to(next(backbone.parameters()).device).eval()


def load_model(s):
    """(model in eval mode, description) of the MODEL_SETTINGS in s, checked by check_model_settings(); the
    description says what the model is, and the code it comes from."""
    try:
        if s["ckpt"] == "random" and s["like"]:
            model = random_twin(load_backbone(s["like"], device=s["device"])[0], s["seed"])
            return model, dict(ckpt="random", like=s["like"], model_type=model.config.model_type,
                               model_args=vars(model.config), seed=s["seed"], code=code_version())
        if s["ckpt"] == "random":
            torch.manual_seed(s["seed"])
            model = Backbone(MODELS[s["model_type"]](make_config(s))).to(s["device"]).eval()
            return model, dict(ckpt="random", model_type=s["model_type"], model_args=vars(model.config), seed=s["seed"],
                               code=code_version())
        model, ckpt = load_backbone(s["ckpt"], device=s["device"])
    except ValueError as e:  # a checkpoint that cannot be read, or a shape no model can have
        raise UserError(str(e)) from None
    # the code that trained it (checkpoints from before it was recorded: None); a random model's is this code
    return model, dict(ckpt=s["ckpt"], model_type=ckpt["model_type"], model_args=ckpt["model_args"],
                       step=ckpt.get("step"), tokens=ckpt.get("tokens"), code=ckpt.get("code"))


def tokenize(texts, block_size):
    """Token ids of single sentences, or of pairs encoded jointly as a + [EOT] + b; (ids, number truncated).

    texts: a list of 1-tuples (sentences) or 2-tuples (pairs). Always GPT-2 ids: a model with a compact
    vocabulary maps them inside encode().
    """
    columns = [encode_batch([t[j] for t in texts]) for j in range(len(texts[0]))]
    ids, n_truncated = [], 0
    for parts in zip(*columns):
        if len(parts) == 1:
            x = parts[0][:block_size] or [EOT]  # our choice: an empty text is a lone <|endoftext|>
        else:
            a, b = parts
            # our choice: trim the longer side first, so each side keeps at least half of the room
            room = block_size - 1
            keep_b = min(len(b), max(room // 2, room - len(a)))
            x = a[:room - keep_b] + [EOT] + b[:keep_b]
        n_truncated += sum(map(len, parts)) + len(parts) - 1 > block_size
        ids.append(x)
    return ids, n_truncated


def pad(seqs, device):
    """Token id lists -> ids (B, T) padded with <pad>, and mask (B, T), True on real tokens."""
    ids = torch.full((len(seqs), max(map(len, seqs))), PAD)
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = True
    return ids.to(device), mask.to(device)


def progress(items, total, desc):
    """Iterate items; with desc, report on stderr: a bar on a terminal, a plain line every 10% in a log file."""
    if desc and sys.stderr.isatty():
        yield from tqdm(items, total=total, desc=desc, leave=False)
        return
    shown = 0
    for i, item in enumerate(items, 1):
        yield item
        if desc and (10 * i // total > shown or i == total):
            shown = 10 * i // total
            print(f"{desc}: {i}/{total} batches", file=sys.stderr, flush=True)


@torch.inference_mode()
def features(model, ids, layers=None, batch_size=64, pool=mean_pool, desc=None):
    """{layer: (N, C) float32 array}: each sequence's states at that layer (default: the last), pooled.

    pool(h, mask) -> (B, C); plain mean over the real tokens by default. Sequences are sorted by length,
    so batches need little padding, and a batch with none runs encode() without a mask (the fast path).
    The model runs in eval mode (dropout off); its train/eval mode is restored afterwards.
    """
    layers = layers or [model.config.n_layer]
    device = next(model.parameters()).device
    order = np.argsort([len(x) for x in ids], kind="stable")
    starts = range(0, len(ids), batch_size)
    pooled = {layer: [] for layer in layers}
    was_training = model.training
    model.eval()
    try:
        for start in progress(starts, len(starts), desc):
            idx, mask = pad([ids[i] for i in order[start:start + batch_size]], device)
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                hs = model.encode(idx, None if mask.all() else mask, layers=list(layers))
                for layer, h in zip(layers, hs):
                    pooled[layer].append(pool(h, mask).float().cpu().numpy())
    finally:
        model.train(was_training)
    out = {}
    for layer, chunks in pooled.items():
        out[layer] = np.empty((len(ids), chunks[0].shape[1]), np.float32)
        out[layer][order] = np.concatenate(chunks)
    return out
