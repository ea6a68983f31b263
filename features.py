"""
What every frozen evaluation shares (probe.py, embed.py): the backbone, a checkpoint or a
random-init baseline; GPT-2 token ids of sentences and of pairs; pooled features by layer, batched by length.
"""
import sys

import numpy as np
import torch
from tqdm import tqdm

from checkpoint import load_checkpoint

from data.tokenizer import EOT, PAD, encode_batch
from model import MODELS, ModelConfig, make_config
from poolers import mean_pool
from errors import UserError


def add_model_args(parser):
    """The options that pick the backbone: --ckpt, and the shape of a --ckpt=random baseline."""
    d = ModelConfig()
    parser.add_argument("--ckpt", default="out/ckpt.pt", help="a train.py checkpoint, or 'random' (untrained baseline)")
    parser.add_argument("--like", default="", help="--ckpt=random: the random twin of this checkpoint (its shape and "
                        "vocabulary map, fresh weights); the baseline a trained checkpoint must beat")
    parser.add_argument("--model_type", default="crossbert", choices=sorted(MODELS),
                        help="--ckpt=random without --like, as the next four")
    parser.add_argument("--n_layer", type=int, default=d.n_layer)
    parser.add_argument("--n_head", type=int, default=d.n_head)
    parser.add_argument("--n_embd", type=int, default=d.n_embd)
    parser.add_argument("--block_size", type=int, default=d.block_size)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def random_twin(model, seed=0):
    """A model of the same shape and vocabulary map as `model`, on its device, with fresh random weights: the
    baseline a trained model must beat (a compact vocabulary sends rare ids to <unk> for both)."""
    torch.manual_seed(seed)
    twin = type(model)(model.config).to(next(model.parameters()).device)
    if model.vocab_map is not None:
        twin.vocab_map.copy_(model.vocab_map)
    return twin.eval()


def load_model(args):
    """(model in eval mode, description) from the add_model_args() options."""
    if args.like and args.ckpt != "random":
        raise UserError(f"--like={args.like} makes a random twin: pass it with --ckpt=random")
    try:
        if args.ckpt == "random" and args.like:
            model = random_twin(load_checkpoint(args.like, device=args.device)[0], args.seed)
            return model, dict(ckpt="random", like=args.like, model_type=model.config.model_type,
                               model_args=vars(model.config), seed=args.seed)
        if args.ckpt == "random":
            torch.manual_seed(args.seed)
            model = MODELS[args.model_type](make_config(vars(args))).to(args.device).eval()
            return model, dict(ckpt="random", model_type=args.model_type, model_args=vars(model.config), seed=args.seed)
        model, ckpt = load_checkpoint(args.ckpt, device=args.device)
    except ValueError as e:  # a checkpoint that cannot be read, or a shape no model can have
        raise UserError(str(e)) from None
    return model, dict(ckpt=args.ckpt, model_type=ckpt["model_type"], model_args=ckpt["model_args"],
                       step=ckpt.get("step"), tokens=ckpt.get("tokens"))


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


def embed_texts(model, pooler, texts, batch_size=256, desc=None):
    """Unit-norm embeddings (N, C) of texts, a float32 CPU tensor in input order: the last layer's states through
    pooler(h, mask), or plain mean pooling when pooler is None; embed.py and its mteb encoder embed through it."""
    ids, _ = tokenize([(t,) for t in texts], model.config.block_size)
    z = features(model, ids, batch_size=batch_size, pool=pooler or mean_pool, desc=desc)[model.config.n_layer]
    return torch.nn.functional.normalize(torch.from_numpy(z), dim=-1)
