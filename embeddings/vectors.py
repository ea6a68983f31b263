"""
Embeddings: the poolers that turn the encoder's token states into one vector per text, their files, unit-norm vectors
of texts, their exact search, and the STS score (embeddings/embed.py, sample.py --neighbours, hf/export.py).

A pooler maps the encoder's token states (B, T, C) and their padding mask (B, T) to one embedding (B, C). embed.py
trains them on a frozen (or finetuned) encoder and hf/export.py ships them beside it, so a saved pooler gives the same
vectors everywhere. Both start out as exactly plain mean pooling (our choice), so training moves away from the
zero-shot row.
"""
import math
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from configurator import UserError
from data.tasks import read_jsonl, read_sts, utf8_lines
from evaluation.features import features, mean_pool, tokenize
from evaluation.metrics import spearman
from plumbing.checkpoint import save_checkpoint


class MeanPooler(nn.Module):
    """Mean pooling, then a learned linear head."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.head = nn.Linear(n_embd, n_embd, bias=False)
        nn.init.eye_(self.head.weight)

    def forward(self, h, mask):
        return self.head(mean_pool(h, mask))


class AttentionPooler(nn.Module):
    """One learned query cross-attends the token states; padded tokens are masked out."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Parameter(torch.zeros(n_embd))  # zero query: uniform attention, i.e. mean pooling
        self.k = nn.Linear(n_embd, n_embd, bias=False)
        self.v = nn.Linear(n_embd, n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        nn.init.normal_(self.k.weight, std=0.02)
        nn.init.eye_(self.v.weight)
        nn.init.eye_(self.proj.weight)

    def forward(self, h, mask):
        B, T, C = h.shape
        q = self.query.view(1, self.n_head, 1, -1).expand(B, -1, -1, -1)
        k = self.k(h).view(B, T, self.n_head, -1).transpose(1, 2)
        v = self.v(h).view(B, T, self.n_head, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, None, :])
        return self.proj(y.reshape(B, C))


POOLERS = {"mean": MeanPooler, "attn": AttentionPooler}


# ----------------------------------------------------------------------------
# Unit-norm embeddings of texts, their exact search, and the STS score

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
