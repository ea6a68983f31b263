"""
Frozen embeddings: a contrastive pooler on a frozen backbone, scored on STS and retrieval.

The paper's second lens (its MTEB protocol, run offline): a small pooler is trained
with InfoNCE and in-batch negatives on top of the frozen encoder ("frozen"), or
together with the backbone ("unfrozen", --unfreeze), in one pass over positive pairs.
Embeddings are compared by cosine similarity:
  STS        Spearman x100 of cosine similarity vs the gold score
  retrieval  nDCG@10 and Recall@100 (x100) on a BEIR folder, exact search
Plain mean pooling with no training at all is the zero-shot row. data/tasks.py reads the STS and
BEIR sets, data/pairs.py the pairs.

    python embed.py --ckpt=out/ckpt.pt --pairs=crop:../shared/corpus/gutenberg --sts=../shared/glue/STS-B
    python embed.py --ckpt=random --like=out/ckpt.pt --pairs=my_pairs.tsv --beir=scifact --unfreeze --out=scores.json

--pairs  crop:PATH         two random spans of one document of a local corpus (Contriever's independent
                           cropping; the files data/local/prepare.py reads: .txt, .jsonl[.gz], .parquet)
         hf:NAME[:CONFIG]  the first two text columns of a hub dataset's train split,
                           e.g. hf:sentence-transformers/msmarco-bm25:triplet (query, positive)
         FILE.tsv|.jsonl   your own pairs: the first two text columns of each line
--sts    STS-B in GLUE layout (a folder with dev.tsv), or a folder/file of SemEval-style
         `score<TAB>sentence1<TAB>sentence2` lines; comma-separate several
--beir   BEIR folders (corpus.jsonl, queries.jsonl, qrels/test.tsv); comma-separate several
--mteb   MTEB tasks scored by mteb's own evaluators (pip install mteb; see mteb_tasks below): task names,
         e.g. STSBenchmark,Banking77Classification (data from the hub), or local STS sets as --sts takes
--save_pooler=PATH  keep the frozen row's trained pooler (weights, kind, dims, the --ckpt it was trained on)

Embedding your own texts with a saved pooler (or plain mean pooling without --load_pooler):

    python embed.py --ckpt=out/ckpt.pt --pairs=crop:data/tinybooks/books.jsonl.gz --sts=../shared/glue/STS-B \
        --save_pooler=pooler.pt
    python embed.py --ckpt=out/ckpt.pt --load_pooler=pooler.pt --texts=my.txt --out_npy=vecs.npy

--texts  a .jsonl file (one object per line, the text in --text_key) or any other text file (one text per line);
         --out_npy gets a float32 matrix, one unit-norm row per text, in input order
"""
import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from checkpoint import save_checkpoint
from errors import UserError, check_writable, fail, user_errors
from data.pairs import pair_stream
from data.tasks import read_beir, read_jsonl, read_sts, utf8_lines
from features import add_model_args, embed_texts, load_model, mean_pool, pad
from poolers import POOLERS
from probe import spearman


def save_pooler(path, pooler, kind, n_embd, n_head, ckpt):
    """Write a trained pooler to path atomically (as checkpoints are): its weights, its kind and dims, and the
    backbone checkpoint it was trained on, which is the one it must be used with."""
    state = {k: v.detach().cpu() for k, v in pooler.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_checkpoint(path, dict(pooler=state, kind=kind, n_embd=n_embd, n_head=n_head, ckpt=str(ckpt)))


def load_pooler(path):
    """(pooler on the CPU, the saved dict) of a --save_pooler file; a missing or foreign file is an UserError."""
    if not os.path.isfile(path):
        raise UserError(f"--load_pooler={path}: no such file; train and keep one with --pairs=... --save_pooler=PATH")
    fix = "pass a file written by embed.py --save_pooler"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{path} is truncated or not a saved pooler ({type(e).__name__}); {fix}") from None
    if not isinstance(saved, dict) or not {"pooler", "kind", "n_embd", "n_head", "ckpt"} <= saved.keys() \
            or saved["kind"] not in POOLERS:
        raise UserError(f"{path} is not a saved pooler (no pooler/kind/n_embd/n_head/ckpt); {fix}")
    pooler = POOLERS[saved["kind"]](saved["n_embd"], saved["n_head"])
    try:
        pooler.load_state_dict(saved["pooler"])
    except RuntimeError:
        raise UserError(f"{path}: its weights do not fit a {saved['kind']} pooler of {saved['n_embd']} dims; "
                        f"{fix}") from None
    return pooler, saved


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
    d = embed_texts(model, pooler, list(corpus.values()), desc="corpus")
    q = embed_texts(model, pooler, [queries[i] for i in qids])
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
            if step == 0:  # a pooler that never trained would be reported as one that did
                raise UserError(f"fewer pairs than one batch of {batch_size}; pass more pairs or a smaller --batch_size")
            print(f"the pairs ran out after {step} steps of {steps}", file=sys.stderr)
            break
        idx, mask = pad([a for a, _ in batch] + [b for _, b in batch], device)  # both sides in one forward
        h = model.encode(idx, mask)  # builds a graph through the backbone only when it is unfrozen
        z = pooler(h, mask)
        loss = info_nce(z[:batch_size], z[batch_size:], temperature)
        if not torch.isfinite(loss):
            raise UserError(f"step {step + 1}: the InfoNCE loss is {loss.item()}; lower --lr or raise --temperature")
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
# Embedding a file of texts (--texts)

def read_texts(path, text_key):
    """The texts of a --texts file in order: each object's text_key field of a .jsonl file (blank lines skipped),
    or each line of any other file (a blank line is an empty text, so row i is still line i)."""
    p = Path(path)
    if not p.is_file():
        what = "a folder" if p.is_dir() else "no such file"
        raise UserError(f"--texts={path}: {what}; pass one .txt file (one text per line) or .jsonl file")
    if p.suffix == ".jsonl":
        texts = [obj[text_key] for _, obj in read_jsonl(p, [text_key])]
    else:
        texts = [line.rstrip("\n") for _, line in utf8_lines(p)]
    if not any(t.strip() for t in texts):
        raise UserError(f"--texts={path}: no text in it; pass a file with one text per line")
    return texts


def embed_file(args):
    """--texts: one unit-norm embedding per text, as a float32 (N, C) .npy file in input order."""
    t0 = time.time()
    texts = read_texts(args.texts, args.text_key)
    pooler, saved = load_pooler(args.load_pooler) if args.load_pooler else (None, None)
    model, info = load_model(args)
    cfg = model.config
    if saved and saved["n_embd"] != cfg.n_embd:
        raise UserError(f"{args.load_pooler} is a pooler of {saved['n_embd']} dims, but --ckpt={args.ckpt} has "
                        f"n_embd={cfg.n_embd}; pass the checkpoint it was trained on, {saved['ckpt']}")
    how = f"the {saved['kind']} pooler of {args.load_pooler} (trained on {saved['ckpt']})" if saved else "mean pooling"
    print(f"{info['model_type']} {cfg.n_layer}x{cfg.n_embd}, {len(texts):,} texts, {how}, on {args.device}",
          file=sys.stderr)
    z = embed_texts(model, None if pooler is None else pooler.to(args.device), texts, desc="embedding").numpy()
    tmp = f"{args.out_npy}.tmp"  # written whole, then renamed: a crash leaves no half-written matrix
    os.makedirs(os.path.dirname(os.path.abspath(tmp)), exist_ok=True)
    with open(tmp, "wb") as f:
        np.save(f, z)
    os.replace(tmp, args.out_npy)
    print(f"wrote {args.out_npy}: {z.shape[0]:,} x {z.shape[1]} float32 in {time.time() - t0:.1f}s", file=sys.stderr)

# ----------------------------------------------------------------------------
# MTEB's own evaluators, for --mteb (optional: pip install mteb; imported here only, so all else runs without it).
# The backbone, with a trained pooler or plain mean pooling, is an mteb encoder; local STS sets are mteb tasks.
# Results go to mteb's standard results folder.

def mteb_tasks(spec):
    """mteb tasks of --mteb, with their data loaded: local STS sets (paths, as --sts takes) or mteb task names."""
    import mteb
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    class LocalSTS(AbsTaskSTS):  # an STS set read by data.tasks.read_sts (GLUE's STS-B folder, or a SemEval-style file)
        def __init__(self, name, pairs):
            self.metadata = TaskMetadata(
                name=name, description=f"local STS set {name}", dataset=dict(path=name, revision="local"), type="STS",
                category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], main_score="cosine_spearman")
            super().__init__()
            s1, s2, score = zip(*pairs)
            self.dataset = DatasetDict(test=Dataset.from_dict(dict(sentence1=s1, sentence2=s2, score=score)))
            self.data_loaded = True

    tasks = []
    for item in spec.split(","):
        if os.path.exists(item):
            tasks += [LocalSTS(name, pairs) for name, pairs in read_sts(item).items()]
            continue
        try:
            task = mteb.get_task(item)
            task.load_data()
        except KeyError:
            raise UserError(f"--mteb: no mteb task {item!r} and no such path; use mteb's task names "
                            "(e.g. STSBenchmark) or a local STS set") from None
        except Exception as e:  # offline, hub down: all end here
            raise UserError(f"--mteb: cannot load {item} from the hub ({str(e).splitlines()[0]}); "
                            "offline, pass a local STS set (e.g. --mteb=../shared/glue/STS-B)") from None
        tasks.append(task)
    return tasks


def mteb_scores(model, pooler, tasks, out_dir, name, revision):
    """{"mteb/<task>": main score x100} of mteb's evaluation of the backbone's last layer through the pooler. The
    name ("org/model") and revision name the results: out_dir/results/<name with __ for />/<revision>/<task>.json, as
    mteb writes them (overwritten)."""
    import mteb
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction

    class Encoder(AbsEncoder):  # mteb's encoder protocol: unit-norm embeddings
        mteb_model_meta = ModelMeta.create_empty(dict(
            name=name, revision=revision, embed_dim=model.config.n_embd, n_parameters=model.num_params(),
            max_tokens=model.config.block_size, similarity_fn_name=ScoringFunction.COSINE, framework=["PyTorch"]))

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
            # all texts at once: embed_texts() sorts them by length, which mteb's batches would not
            texts = [text for batch in inputs for text in batch["text"]]
            return embed_texts(model, pooler, texts).double().numpy()  # float64 cosines, as eval_sts

    result = mteb.evaluate(Encoder(), tasks, cache=mteb.ResultCache(out_dir), overwrite_strategy="always",
                           show_progress_bar=sys.stderr.isatty(), encode_kwargs=dict(batch_size=256))
    return {f"mteb/{r.task_name}": 100 * float(r.get_score()) for r in result.task_results}


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
    ap.add_argument("--save_pooler", default="", help="keep the frozen row's trained pooler in this file")
    ap.add_argument("--texts", default="", help="embed this file's texts (.txt: one per line, or .jsonl) into --out_npy")
    ap.add_argument("--text_key", default="text", help="the text field of a .jsonl --texts file")
    ap.add_argument("--load_pooler", default="", help="with --texts: a --save_pooler file (default: mean pooling)")
    ap.add_argument("--out_npy", default="", help="with --texts: the .npy file to write")
    args = ap.parse_args(argv)
    if args.texts:
        if args.sts or args.beir or args.mteb or args.pairs or args.save_pooler:
            fail("--texts only embeds: train and keep a pooler in a run of its own (--pairs, --save_pooler)", "embed.py")
        if not args.out_npy:
            fail("--texts needs --out_npy=PATH, the .npy file to write", "embed.py")
    else:
        if args.load_pooler or args.out_npy:
            fail("--load_pooler and --out_npy go with --texts=FILE", "embed.py")
        if not (args.sts or args.beir or args.mteb):
            fail("nothing to evaluate: pass --sts=..., --beir=... and/or --mteb=... (or --texts=... to embed)", "embed.py")
        if (args.unfreeze or args.save_pooler) and not args.pairs:
            fail("--unfreeze and --save_pooler train on pairs: pass --pairs=...", "embed.py")
        if args.save_pooler and args.ckpt == "random":
            fail("--save_pooler keeps a pooler for the backbone in --ckpt; pass a checkpoint, not random", "embed.py")
    if args.temperature <= 0 or args.steps < 1:
        fail(f"--temperature must be > 0 (got {args.temperature}) and --steps at least 1 (got {args.steps})",
             "embed.py")
    if args.pairs and args.batch_size < 2:  # InfoNCE's negatives are the batch's other pairs
        fail(f"--batch_size={args.batch_size}: contrastive training needs at least 2 pairs a batch", "embed.py")
    with user_errors("embed.py"):
        for option in ("out", "out_npy", "save_pooler"):  # outputs are checked before any work
            if getattr(args, option):
                check_writable(getattr(args, option), f"--{option}", folder=False)
        if args.mteb:
            check_writable(args.mteb_out, "--mteb_out")
        if args.texts:
            embed_file(args)
        else:
            run(args)


def run(args):
    t_start = time.time()
    # read every evaluation set first, so a malformed file fails before any training
    sts = {k: v for path in filter(None, args.sts.split(",")) for k, v in read_sts(path).items()}
    beir = {Path(path).name: read_beir(path) for path in filter(None, args.beir.split(","))}
    mteb_sets = mteb_tasks(args.mteb) if args.mteb else None
    model, info = load_model(args)
    model_type, cfg = info["model_type"], model.config
    if args.pairs and next(pair_stream(args.pairs, args.seed, cfg.block_size), None) is None:
        raise UserError(f"--pairs={args.pairs}: no pairs there")  # checked now, not after the zero-shot evaluation
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
            if name == "frozen" and args.save_pooler:  # the frozen pooler goes with --ckpt as it is on disk
                save_pooler(args.save_pooler, pooler, args.pooler, cfg.n_embd, cfg.n_head, args.ckpt)
                print(f"saved the {args.pooler} pooler to {args.save_pooler}", file=sys.stderr)
        t1 = time.time()
        scores = evaluate(model, pooler, sts, beir)
        if args.mteb:
            revision = "random" if args.ckpt == "random" else f"step-{info.get('step')}"
            scores.update(mteb_scores(model, pooler, mteb_sets, args.mteb_out,
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
