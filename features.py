"""
What the frozen evaluators share (probe.py, embed.py, sample.py, hf/export.py): the settings that pick the backbone, a
checkpoint or a random-init baseline; GPT-2 token ids of sentences and of pairs; pooled features by layer, batched by
length; the tasks' metrics; unit-norm embeddings, their exact search and the STS score; saved poolers; a file of
texts. Library code: it raises UserError, never exits.
"""
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from checkpoint import code_version, load_checkpoint, save_checkpoint
from data.tasks import read_jsonl, read_sts, utf8_lines
from data.tokenizer import EOT, PAD, encode_batch
from errors import UserError, check_device
from model import MODELS, POOLERS, ModelConfig, make_config, mean_pool

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


def random_twin(model, seed=0):
    """A model of the same shape and vocabulary map as `model`, on its device, with fresh random weights: the
    baseline a trained model must beat (a compact vocabulary sends rare ids to <unk> for both)."""
    torch.manual_seed(seed)
    twin = type(model)(model.config).to(next(model.parameters()).device)
    if model.vocab_map is not None:
        twin.vocab_map.copy_(model.vocab_map)
    return twin.eval()


def load_model(s):
    """(model in eval mode, description) of the MODEL_SETTINGS in s, checked by check_model_settings(); the
    description says what the model is, and the code it comes from."""
    try:
        if s["ckpt"] == "random" and s["like"]:
            model = random_twin(load_checkpoint(s["like"], device=s["device"])[0], s["seed"])
            return model, dict(ckpt="random", like=s["like"], model_type=model.config.model_type,
                               model_args=vars(model.config), seed=s["seed"], code=code_version())
        if s["ckpt"] == "random":
            torch.manual_seed(s["seed"])
            model = MODELS[s["model_type"]](make_config(s)).to(s["device"]).eval()
            return model, dict(ckpt="random", model_type=s["model_type"], model_args=vars(model.config), seed=s["seed"],
                               code=code_version())
        model, ckpt = load_checkpoint(s["ckpt"], device=s["device"])
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


# ----------------------------------------------------------------------------
# Metrics: each task's (data/tasks.py names them), on numpy arrays of predictions and gold labels; binary metrics take
# class 1 as positive


def accuracy(pred, gold):
    return float(np.mean(pred == gold))


def f1(pred, gold, positive=1):
    tp = np.sum((pred == positive) & (gold == positive))
    wrong = np.sum((pred == positive) != (gold == positive))  # false positives + false negatives
    return float(2 * tp / (2 * tp + wrong)) if tp else 0.0


def macro_f1(pred, gold):
    return float(np.mean([f1(pred, gold, c) for c in np.union1d(pred, gold)]))


def matthews(pred, gold):
    tp, tn = float(np.sum((pred == 1) & (gold == 1))), float(np.sum((pred != 1) & (gold != 1)))
    fp, fn = float(np.sum((pred == 1) & (gold != 1))), float(np.sum((pred != 1) & (gold == 1)))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0  # a constant prediction or gold: no correlation


def pearson(x, y):
    x, y = x - np.mean(x), y - np.mean(y)
    den = math.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / den) if den else 0.0


def ranks(x):
    """1-based ranks of x; tied values share the average of their ranks."""
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x)[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]
    r = np.empty(len(xs))
    r[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return r


def spearman(x, y):
    return pearson(ranks(x), ranks(y))


METRICS = dict(acc=accuracy, f1=f1, macro_f1=macro_f1, mcc=matthews, pearson=pearson, spearman=spearman)

# ----------------------------------------------------------------------------
# Embeddings: unit-norm vectors of texts, their exact search, and the STS score


def embed_texts(model, pooler, texts, batch_size=256, desc=None):
    """Unit-norm embeddings (N, C) of texts, a float32 CPU tensor in input order: the last layer's states through
    pooler(h, mask), or plain mean pooling when pooler is None; embed.py and its mteb encoder embed through it."""
    ids, _ = tokenize([(t,) for t in texts], model.config.block_size)
    z = features(model, ids, batch_size=batch_size, pool=pooler or mean_pool, desc=desc)[model.config.n_layer]
    return F.normalize(torch.from_numpy(z), dim=-1)


def search(q, d, k, exclude, q_chunk=1024, d_chunk=16384):
    """Exact top-k corpus rows (Nq, k) by cosine similarity of unit vectors, a matmul in chunks to bound memory.
    exclude (Nq,): one corpus row per query that it must not return (a doc with the query's own id), or -1."""
    out = []
    for i in range(0, len(q), q_chunk):
        qs, ex = q[i:i + q_chunk], exclude[i:i + q_chunk]
        best_s, best_i = qs.new_empty(len(qs), 0), torch.empty(len(qs), 0, dtype=torch.long)
        for j in range(0, len(d), d_chunk):
            sim = qs @ d[j:j + d_chunk].T
            hit = ((ex >= j) & (ex < j + sim.size(1))).nonzero().squeeze(1)
            sim[hit, ex[hit] - j] = -math.inf
            s = torch.cat([best_s, sim], 1)
            ix = torch.cat([best_i, torch.arange(j, j + sim.size(1)).expand(len(qs), -1)], 1)
            best_s, top = s.topk(min(k, s.size(1)), dim=1)
            best_i = ix.gather(1, top)
        out.append(best_i)
    return torch.cat(out)


def eval_sts(model, pooler, pairs):
    """Spearman x100 between cosine similarity and the gold score; pairs: [(sentence1, sentence2, score)]."""
    s1, s2, gold = zip(*pairs)
    # cosines in float64: float32 rounding ties or swaps close cosines, which moves the score by about 1e-4
    e1, e2 = (F.normalize(embed_texts(model, pooler, s).double(), dim=-1) for s in (s1, s2))
    return 100 * spearman((e1 * e2).sum(-1).numpy(), gold)


def zero_shot_sts(model, sts_path):
    """The zero-shot STS score: Spearman x100 of the cosine similarity of plain mean-pooled last-layer
    features vs the gold score, on one STS set (a GLUE STS-B folder, or a SemEval-style file)."""
    sets = read_sts(sts_path)
    if len(sets) != 1:
        raise UserError(f"{sts_path} holds {len(sets)} STS sets ({', '.join(sets)}); pass one of them")
    return eval_sts(model, None, *sets.values())

# ----------------------------------------------------------------------------
# Files: a saved pooler (embed.py writes it; embed.py --texts and hf/export.py read it), a file of texts


def save_pooler(path, pooler, kind, n_embd, n_head, ckpt):
    """Write a trained pooler to path atomically (as checkpoints are): its weights, its kind and dims, and the
    backbone checkpoint it was trained on, which is the one it must be used with."""
    state = {k: v.detach().cpu() for k, v in pooler.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_checkpoint(path, dict(pooler=state, kind=kind, n_embd=n_embd, n_head=n_head, ckpt=str(ckpt)))


def load_pooler(path, setting):
    """(pooler on the CPU, the saved dict) of a file save_pooler() wrote, passed as the option `setting` (e.g.
    "--pooler"); a missing or foreign file is a UserError."""
    if not os.path.isfile(path):
        raise UserError(f"{setting}={path}: no such file; train and keep one with embed.py --pairs=... "
                        "--save_pooler=PATH")
    fix = "pass a file written by embed.py --save_pooler"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{setting}={path} is truncated or not a saved pooler ({type(e).__name__}); {fix}") from None
    if not isinstance(saved, dict) or not {"pooler", "kind", "n_embd", "n_head", "ckpt"} <= saved.keys() \
            or saved["kind"] not in POOLERS:
        raise UserError(f"{setting}={path} is not a saved pooler (no pooler/kind/n_embd/n_head/ckpt); {fix}")
    pooler = POOLERS[saved["kind"]](saved["n_embd"], saved["n_head"])
    try:
        pooler.load_state_dict(saved["pooler"])
    except RuntimeError:
        raise UserError(f"{setting}={path}: its weights do not fit a {saved['kind']} pooler of {saved['n_embd']} "
                        f"dims; {fix}") from None
    return pooler, saved


def read_texts(path, text_key, setting):
    """The texts of a file passed as the option `setting` (e.g. "--texts"), in order: each object's text_key field of
    a .jsonl file (blank lines skipped), or each line of any other file (a blank line is an empty text, so row i is
    still line i)."""
    p = Path(path)
    if not p.is_file():
        what = "a folder" if p.is_dir() else "no such file"
        raise UserError(f"{setting}={path}: {what}; pass one .txt file (one text per line) or .jsonl file")
    if p.suffix == ".jsonl":
        texts = [obj[text_key] for _, obj in read_jsonl(p, [text_key])]
    else:
        texts = [line.rstrip("\n") for _, line in utf8_lines(p)]
    if not any(t.strip() for t in texts):
        raise UserError(f"{setting}={path}: no text in it; pass a file with one text per line")
    return texts
