"""
Frozen embeddings: a contrastive pooler on a frozen backbone, scored on STS and retrieval.

The paper's second lens (its MTEB protocol, run offline): a small pooler is trained
with InfoNCE and in-batch negatives on top of the frozen encoder ("frozen"), or
together with the backbone ("unfrozen", --unfreeze), in one pass over positive pairs.
Embeddings are compared by cosine similarity:
  STS        Spearman x100 of cosine similarity vs the gold score
  retrieval  nDCG@10 and Recall@100 (x100) on a BEIR folder, exact search
Plain mean pooling with no training at all is the zero-shot row.

    python embed.py --ckpt=out/ckpt.pt --pairs=crop:../shared/corpus/gutenberg --sts=../shared/glue/STS-B
    python embed.py --ckpt=random --pairs=my_pairs.tsv --beir=scifact --unfreeze --out=scores.json

--pairs  crop:PATH         two random spans of one document of a local corpus (Contriever's independent
                           cropping; the files data/local/prepare.py reads: .txt, .jsonl[.gz], .parquet)
         hf:NAME[:CONFIG]  the first two text columns of a hub dataset's train split,
                           e.g. hf:sentence-transformers/msmarco-bm25:triplet (query, positive)
         FILE.tsv|.jsonl   your own pairs: the first two text columns of each line
--sts    STS-B in GLUE layout (a folder with dev.tsv), or a folder/file of SemEval-style
         `score<TAB>sentence1<TAB>sentence2` lines; comma-separate several
--beir   BEIR folders (corpus.jsonl, queries.jsonl, qrels/test.tsv); comma-separate several
--mteb   MTEB tasks scored by mteb's own evaluators (pip install mteb; see mteb_eval.py): task names,
         e.g. STSBenchmark,Banking77Classification (data from the hub), or local STS sets as --sts takes
"""
import argparse
import gzip
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from data.corpus import FORMATS, find_files, read_files
from data.tokenizer import EOT, encode
from features import EvalError, add_model_args, features, load_model, mean_pool, pad, tokenize
from probe import read_table, spearman  # GLUE's STS-B goes through the probes' GLUE reader

# ----------------------------------------------------------------------------
# Poolers: (B, T, C) token states + (B, T) padding mask -> (B, C) embedding.
# Both start out as exactly plain mean pooling (our choice), so training moves away from the zero-shot row.

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


def info_nce(a, b, temperature):
    """Symmetric InfoNCE with in-batch negatives: a[i] must pick b[i] among all of b, and b[i] must pick a[i].
    Symmetric (our choice): both sides of a crop pair are alike, and the second direction adds negatives for free."""
    logits = F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T / temperature
    labels = torch.arange(len(a), device=a.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2

# ----------------------------------------------------------------------------
# Metrics

def ndcg_at_k(ranked, qrel, k=10):
    """nDCG@k of ranked doc ids against {doc id: grade > 0}, with linear gains (trec_eval's, as BEIR and MTEB)."""
    dcg = sum(qrel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(qrel.values(), reverse=True)[:k]))
    return dcg / ideal


def recall_at_k(ranked, qrel, k=100):
    """Fraction of the relevant docs that are in the top k."""
    return len(qrel.keys() & set(ranked[:k])) / len(qrel)

# ----------------------------------------------------------------------------
# Embedding and evaluation

def embed(model, pooler, texts, batch_size=256, desc=None):
    """Unit-norm embeddings (N, C) of texts: the pooler's, or plain mean pooling when pooler is None."""
    ids, _ = tokenize([(t,) for t in texts], model.config.block_size)
    z = features(model, ids, batch_size=batch_size, pool=pooler or mean_pool, desc=desc)[model.config.n_layer]
    return F.normalize(torch.from_numpy(z), dim=-1)


def eval_sts(model, pooler, pairs):
    """Spearman x100 between cosine similarity and the gold score; pairs: [(sentence1, sentence2, score)]."""
    s1, s2, gold = zip(*pairs)
    # cosines in float64: float32 rounding ties or swaps close cosines, which moves the score by about 1e-4
    e1, e2 = (F.normalize(embed(model, pooler, s).double(), dim=-1) for s in (s1, s2))
    return 100 * spearman((e1 * e2).sum(-1).numpy(), gold)


def zero_shot_sts(model, sts_path):
    """The zero-shot STS score: Spearman x100 of the cosine similarity of plain mean-pooled last-layer
    features vs the gold score, on one STS set (a GLUE STS-B folder, or a SemEval-style file)."""
    sets = read_sts(sts_path)
    if len(sets) != 1:
        raise EvalError(f"{sts_path} holds {len(sets)} STS sets ({', '.join(sets)}); pass one of them")
    return eval_sts(model, None, *sets.values())


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


def eval_retrieval(model, pooler, beir, k=100):
    """nDCG@10 and Recall@100 (x100), averaged over the queries that have a relevant doc."""
    corpus, queries, qrels = beir
    doc_ids, qids = list(corpus), list(qrels)
    d = embed(model, pooler, list(corpus.values()), desc="corpus")
    q = embed(model, pooler, [queries[i] for i in qids])
    row = {doc: r for r, doc in enumerate(doc_ids)}
    # as BEIR and MTEB: a query never retrieves a doc with its own id (datasets where queries are docs too)
    exclude = torch.tensor([row.get(i, -1) for i in qids])
    ranked = [[doc_ids[r] for r in top] for top in search(q, d, k, exclude).tolist()]
    return {"ndcg@10": 100 * float(np.mean([ndcg_at_k(r, qrels[i], 10) for r, i in zip(ranked, qids)])),
            "recall@100": 100 * float(np.mean([recall_at_k(r, qrels[i], 100) for r, i in zip(ranked, qids)]))}


def evaluate(model, pooler, sts, beir):
    """{task or task/metric: score} for every STS set and BEIR folder."""
    scores = {name: eval_sts(model, pooler, pairs) for name, pairs in sts.items()}
    for name, data in beir.items():
        scores.update({f"{name}/{m}": v for m, v in eval_retrieval(model, pooler, data).items()})
    return scores

# ----------------------------------------------------------------------------
# Contrastive training

def train(model, pooler, pairs, steps, batch_size, lr, backbone_lr, temperature, unfreeze, log=None):
    """One pass over the token-id pairs: InfoNCE on pooled embeddings of both sides. Returns the losses.
    Frozen: the backbone gets no gradient and stays in eval mode; only the pooler learns."""
    device = next(model.parameters()).device
    model.requires_grad_(unfreeze)
    model.train(unfreeze)
    groups = [{"params": list(pooler.parameters()), "lr": lr}]
    groups += [{"params": list(model.parameters()), "lr": backbone_lr}] if unfreeze else []
    opt = torch.optim.AdamW(groups, weight_decay=0.0)  # one short pass over fresh pairs: nothing to regularise
    warmup = max(1, steps // 10)
    losses, t0 = [], time.time()
    for step in range(steps):
        batch = list(itertools.islice(pairs, batch_size))
        if len(batch) < batch_size:
            print(f"the pairs ran out after {step} steps of {steps}", file=sys.stderr)
            break
        idx, mask = pad([a for a, _ in batch] + [b for _, b in batch], device)  # both sides in one forward
        h = model.encode(idx, mask)  # builds a graph through the backbone only when it is unfrozen
        z = pooler(h, mask)
        loss = info_nce(z[:batch_size], z[batch_size:], temperature)
        scale = min((step + 1) / warmup, (steps - step) / (steps - warmup + 1))  # linear warmup, linear decay
        for g, base in zip(opt.param_groups, (lr, backbone_lr)):
            g["lr"] = base * scale
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log and (step % 25 == 0 or step == steps - 1):
            print(f"{log} step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", file=sys.stderr)
    return losses

# ----------------------------------------------------------------------------
# Positive pairs

def read_jsonl(path, keys=()):
    """(line number, object) of a .jsonl or .jsonl.gz file; every object must have the string fields `keys`."""
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{path}:{n}: not valid JSON ({e.msg}); fix: one JSON object per line") from None
            if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in keys):
                raise EvalError(f"{path}:{n}: expected a JSON object with the fields {list(keys)}; fix: add them")
            yield n, obj


def crop_pairs(path, seed, passage=64, chars_per_passage=10_000, lo=0.1, hi=0.5):
    """Contriever's independent cropping: two random spans, each 10-50% long, of one passage of one document.
    Our choice: a whole book is too broad to be one "document", so passages of `passage` tokens are
    cut at random places, one per `chars_per_passage` characters of text.
    path: a corpus as data/local/prepare.py reads it, through the same reader."""
    try:
        find_files(str(path))
    except (OSError, ValueError):
        raise EvalError(f"--pairs=crop:{path}: no corpus there; pass {FORMATS}") from None
    rng = random.Random(seed)

    def span(ids):
        n = rng.randint(max(1, round(lo * len(ids))), max(1, round(hi * len(ids))))
        start = rng.randint(0, len(ids) - n)
        return ids[start:start + n]

    for text in read_files(str(path)):
        for _ in range(max(1, len(text) // chars_per_passage)):
            start = rng.randrange(max(1, len(text) - 8 * passage))  # 8 characters a token is plenty for English
            ids = encode(text[start:start + 8 * passage])[1:passage + 1]  # the cut may split the first word
            if len(ids) >= 8:
                yield span(ids), span(ids)


def first_two_texts(values, where):
    texts = [v for v in values if isinstance(v, str)]
    if len(texts) < 2:
        raise EvalError(f"{where}: expected two text columns, found {len(texts)}; fix: one pair per line, "
                        "`text_a<TAB>text_b` (.tsv) or {\"a\": ..., \"b\": ...} (.jsonl)")
    return texts[0], texts[1]


def text_pairs(spec):
    """(text, text) pairs of a hub dataset (hf:NAME[:CONFIG]) or a local .tsv / .jsonl file."""
    if spec.startswith("hf:"):
        from datasets import load_dataset  # only this source needs it (and the internet)
        name, _, config = spec[3:].partition(":")
        try:
            rows = load_dataset(name, config or None, split="train", streaming=True)
        except Exception as e:  # offline, unknown name or config: all end here
            raise EvalError(f"--pairs={spec}: cannot load it from the hub ({str(e).splitlines()[0]}); offline, "
                            "use --pairs=crop:CORPUS or a local .tsv/.jsonl of pairs") from None
        for row in rows:
            yield first_two_texts(row.values(), spec)
        return
    path = Path(spec)
    if not path.is_file() or path.suffix not in (".tsv", ".jsonl"):
        raise EvalError(f"--pairs={spec}: no such .tsv or .jsonl file; pass crop:CORPUS, hf:NAME[:CONFIG] or a pairs file")
    if path.suffix == ".jsonl":
        for n, obj in read_jsonl(path):
            yield first_two_texts(obj.values(), f"{path}:{n}")
        return
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                yield first_two_texts(line.rstrip("\n").split("\t"), f"{path}:{n}")


def pair_stream(spec, seed, max_len, buffer=4096):
    """Token-id pairs of --pairs through a shuffle buffer: bounded memory, an order reproducible from the seed,
    and runs of pairs of one book or one query spread out (a query repeated in a batch is a false negative)."""
    if spec.startswith("crop:"):
        pairs = crop_pairs(spec[5:], seed)
    else:
        pairs = ((encode(a)[:max_len] or [EOT], encode(b)[:max_len] or [EOT]) for a, b in text_pairs(spec))
    rng, buf = random.Random(seed + 1), []
    for pair in pairs:
        buf.append(pair)
        if len(buf) >= buffer:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    rng.shuffle(buf)
    yield from buf

# ----------------------------------------------------------------------------
# Evaluation readers

def read_sts(path):
    """{name: [(sentence1, sentence2, score)]}: STS-B in GLUE's layout (a folder with dev.tsv), or SemEval-style
    files of `score<TAB>sentence1<TAB>sentence2` lines (a file, or every .tsv/.txt file of a folder)."""
    p, columns = Path(path), ("sentence1", "sentence2", "score")
    if (p / "dev.tsv").is_file():
        files = {p.name: (p / "dev.tsv", None)}  # GLUE's header names the columns
    else:
        found = sorted(f for f in p.iterdir() if f.suffix in (".tsv", ".txt")) if p.is_dir() else [p]
        if not found or not found[0].is_file():
            raise EvalError(f"--sts={path}: no STS-B dev.tsv and no .tsv/.txt files of `score<TAB>s1<TAB>s2` lines there")
        files = {f"{p.name}/{f.stem}" if p.is_dir() else f.stem: (f, ("score",) + columns[:2]) for f in found}
    return {name: [(a, b, y) for (a, b), y in zip(*read_table(f, columns, None, header))]
            for name, (f, header) in files.items()}


def read_beir(folder):
    """(corpus {doc id: title + text}, queries {query id: text}, qrels {query id: {doc id: grade > 0}})."""
    p = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        if not (p / name).is_file():
            raise EvalError(f"--beir={folder}: no {name}; a BEIR folder holds corpus.jsonl, queries.jsonl, qrels/test.tsv")
    corpus = {str(d["_id"]): f"{d.get('title') or ''} {d['text']}".strip()
              for _, d in read_jsonl(p / "corpus.jsonl", ["_id", "text"])}
    queries = {str(q["_id"]): q["text"] for _, q in read_jsonl(p / "queries.jsonl", ["_id", "text"])}
    qrels, path = {}, p / "qrels/test.tsv"
    with open(path, encoding="utf-8") as f:
        if f.readline().rstrip("\n").split("\t") != ["query-id", "corpus-id", "score"]:
            raise EvalError(f"{path}:1: expected the header query-id<TAB>corpus-id<TAB>score; fix: add it")
        for n, line in enumerate(f, 2):
            if not line.strip():
                continue
            r = line.rstrip("\n").split("\t")
            if len(r) != 3 or not r[2].lstrip("-").isdigit():
                raise EvalError(f"{path}:{n}: expected query-id<TAB>corpus-id<TAB>integer score; fix that line")
            if r[0] not in queries:
                raise EvalError(f"{path}:{n}: query id {r[0]!r} is not in queries.jsonl; fix the id or add the query")
            if int(r[2]) > 0:  # grade 0 (judged not relevant) counts the same as unjudged for both metrics
                qrels.setdefault(r[0], {})[r[1]] = int(r[2])
    if not qrels:
        raise EvalError(f"{path}: no query has a relevant doc (score > 0); nothing to evaluate")
    return corpus, queries, qrels

# ----------------------------------------------------------------------------
# Command line

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--pairs", default="", help="crop:PATH, hf:NAME[:CONFIG] or a .tsv/.jsonl file; none: zero-shot only")
    ap.add_argument("--sts", default="", help="STS sets, comma-separated")
    ap.add_argument("--beir", default="", help="BEIR folders, comma-separated")
    ap.add_argument("--mteb", default="", help="MTEB task names or local STS sets, comma-separated (pip install mteb)")
    ap.add_argument("--mteb_out", default="mteb_results", help="mteb's results folder, one subfolder per row")
    ap.add_argument("--pooler", default="attn", choices=sorted(POOLERS))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3, help="pooler learning rate")
    ap.add_argument("--backbone_lr", type=float, default=1e-4, help="backbone learning rate with --unfreeze")
    ap.add_argument("--temperature", type=float, default=0.05)
    ap.add_argument("--unfreeze", action="store_true", help="also train a pooler with the backbone finetuned")
    ap.add_argument("--out", default="", help="write every score and timing to this .json file")
    args = ap.parse_args(argv)
    if not (args.sts or args.beir or args.mteb):
        ap.error("nothing to evaluate: pass --sts=..., --beir=... and/or --mteb=...")
    if args.unfreeze and not args.pairs:
        ap.error("--unfreeze trains on pairs: pass --pairs=...")
    try:
        run(args)
    except EvalError as e:
        sys.exit(f"embed.py: error: {e}")


def run(args):
    t_start = time.time()
    # read every evaluation set first, so a malformed file fails before any training
    sts = {k: v for path in filter(None, args.sts.split(",")) for k, v in read_sts(path).items()}
    beir = {Path(path).name: read_beir(path) for path in filter(None, args.beir.split(","))}
    if args.mteb:
        import mteb_eval  # mteb is optional: only --mteb needs it
        mteb_tasks = mteb_eval.get_tasks(args.mteb)
    model, info = load_model(args)
    model_type, cfg = info["model_type"], model.config
    if args.pairs:  # a bad --pairs fails now, not after the zero-shot evaluation
        next(pair_stream(args.pairs, args.seed, cfg.block_size))
    print(f"{model_type} {cfg.n_layer}x{cfg.n_embd}, {model.num_params() / 1e6:.1f}M params", file=sys.stderr)

    rows = []
    for name in ["zero-shot"] + ["frozen"] * bool(args.pairs) + ["unfrozen"] * args.unfreeze:
        t0, losses, pooler = time.time(), [], None
        if name != "zero-shot":  # the same pooler init and the same pairs for frozen and unfrozen
            torch.manual_seed(args.seed)
            pooler = POOLERS[args.pooler](cfg.n_embd, cfg.n_head).to(args.device)
            pairs = pair_stream(args.pairs, args.seed, cfg.block_size)
            losses = train(model, pooler, pairs, args.steps, args.batch_size, args.lr, args.backbone_lr,
                           args.temperature, unfreeze=name == "unfrozen", log=name)
        t1 = time.time()
        scores = evaluate(model, pooler, sts, beir)
        if args.mteb:
            revision = "random" if args.ckpt == "random" else f"step-{info.get('step')}"
            scores.update(mteb_eval.run(model, pooler, mteb_tasks, args.mteb_out,
                                        f"{model_type}-{cfg.n_layer}x{cfg.n_embd}/{name}", revision))
        rows.append(dict(name=name if pooler is None else f"{name} ({args.pooler} pooler)", scores=scores,
                         steps=len(losses), final_loss=losses[-1] if losses else None,
                         train_s=t1 - t0, eval_s=time.time() - t1))
        print(f"{rows[-1]['name']}: {scores}", file=sys.stderr)

    cols = list(rows[0]["scores"])
    print(f"| {model_type} {cfg.n_layer}x{cfg.n_embd} ({args.ckpt}) | " + " | ".join(cols) + " | train s | eval s |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        print(f"| {r['name']} | " + " | ".join(f"{r['scores'][c]:.1f}" for c in cols)
              + f" | {r['train_s']:.0f} | {r['eval_s']:.0f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), model_type=model_type, model_args=vars(cfg), rows=rows,
                           wall_s=time.time() - t_start), f, indent=2)


if __name__ == "__main__":
    main()
