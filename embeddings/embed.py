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

    python embeddings/embed.py --ckpt=out/ckpt.pt --pairs=crop:DIR/corpus --sts=DIR/glue/STS-B
    python embeddings/embed.py --ckpt=random --like=out/ckpt.pt --pairs=my_pairs.tsv --beir=scifact --unfreeze \
        --out=scores.json

--pairs  crop:PATH         two random spans of one document of a local corpus (Contriever's independent
                           cropping; the files data/local/prepare.py reads: .txt, .jsonl[.gz], .parquet)
         hf:NAME[:CONFIG]  the first two text columns of a hub dataset's train split,
                           e.g. hf:sentence-transformers/msmarco-bm25:triplet (query, positive)
         FILE.tsv|.jsonl   your own pairs: the first two text columns of each line
--sts    STS-B in GLUE layout (a folder with dev.tsv), or a folder/file of SemEval-style
         `score<TAB>sentence1<TAB>sentence2` lines; comma-separate several
--beir   BEIR folders (corpus.jsonl, queries.jsonl, qrels/test.tsv); comma-separate several
--mteb   MTEB tasks scored by mteb's own evaluators (an optional extra; see mteb_tasks below): task names,
         e.g. STSBenchmark,Banking77Classification (data from the hub), or local STS sets as --sts takes
--save_pooler=PATH  keep the frozen row's trained pooler (weights, kind, dims, the --ckpt it was trained on)

Embedding your own texts with a saved pooler (or plain mean pooling without --load_pooler):

    python embeddings/embed.py --ckpt=out/ckpt.pt --pairs=crop:data/tinybooks/books.jsonl.gz --sts=DIR/glue/STS-B \
        --save_pooler=pooler.pt
    python embeddings/embed.py --ckpt=out/ckpt.pt --load_pooler=pooler.pt --texts=my.txt --out_npy=vecs.npy

--texts  a .jsonl file (one object per line, the text in --text_key) or any other text file (one text per line);
         --out_npy gets a float32 matrix, one unit-norm row per text, in input order
"""
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from configurator import UserError, configure, user_errors
from data.pairs import pair_stream
from data.tasks import read_beir, read_sts
from plumbing.checks import check_writable, optional
from embeddings.vectors import POOLERS, embed_texts, eval_sts, load_pooler, read_texts, save_pooler, search
import evaluation.features as features_module
from evaluation.features import MODEL_SETTINGS, check_model_settings, load_model, pad

settings = dict(
    **MODEL_SETTINGS,
    pairs="",                 # crop:PATH, hf:NAME[:CONFIG] or a .tsv/.jsonl file of positive pairs; "" = zero-shot only
    sts="",                   # STS sets, comma-separated
    beir="",                  # BEIR folders, comma-separated
    mteb="",                  # MTEB task names or local STS sets, comma-separated (an optional extra: pip install mteb)
    mteb_out="mteb_results",  # mteb's results folder, one subfolder per row
    pooler="attn",            # attn | mean
    steps=200,                # training steps of each pooler: one pass over fresh pairs
    batch_size=64,            # pairs per step; each pair's negatives are the others' sides
    lr=1e-3,                  # pooler learning rate (linear warmup, linear decay)
    backbone_lr=1e-4,         # backbone learning rate with --unfreeze
    temperature=0.05,         # InfoNCE's softmax temperature
    unfreeze=False,           # also train a pooler with the backbone finetuned
    out="",                   # write every score and timing to this .json file
    save_pooler="",           # keep the frozen row's trained pooler in this file
    texts="",                 # embed this file's texts (.txt: one per line, or .jsonl) into --out_npy
    text_key="text",          # the text field of a .jsonl --texts file
    load_pooler="",           # with --texts: a --save_pooler file ("" = mean pooling)
    out_npy="",               # with --texts: the .npy file to write
)


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
# Evaluation

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

def embed_file(s):
    """--texts: one unit-norm embedding per text, as a float32 (N, C) .npy file in input order."""
    t0 = time.time()
    texts = read_texts(s["texts"], s["text_key"], "--texts")
    pooler, saved = load_pooler(s["load_pooler"], "--load_pooler") if s["load_pooler"] else (None, None)
    model, info = load_model(s)
    cfg = model.config
    if saved and saved["n_embd"] != cfg.n_embd:
        raise UserError(f"--load_pooler={s['load_pooler']} is a pooler of {saved['n_embd']} dims, but "
                        f"--ckpt={s['ckpt']} has n_embd={cfg.n_embd}; pass the checkpoint it was trained on, "
                        f"{saved['ckpt']}")
    how = f"the {saved['kind']} pooler of {s['load_pooler']} (trained on {saved['ckpt']})" if saved else "mean pooling"
    print(f"{info['model_type']} {cfg.n_layer}x{cfg.n_embd}, {len(texts):,} texts, {how}, on {s['device']}",
          file=sys.stderr)
    z = embed_texts(model, None if pooler is None else pooler.to(s["device"]), texts, desc="embedding").numpy()
    tmp = f"{s['out_npy']}.tmp"  # written whole, then renamed: a crash leaves no half-written matrix
    os.makedirs(os.path.dirname(os.path.abspath(tmp)), exist_ok=True)
    with open(tmp, "wb") as f:
        np.save(f, z)
    os.replace(tmp, s["out_npy"])
    print(f"wrote {s['out_npy']}: {z.shape[0]:,} x {z.shape[1]} float32 in {time.time() - t0:.1f}s", file=sys.stderr)

# ----------------------------------------------------------------------------
# MTEB's own evaluators, for --mteb (an optional extra, imported here only, so all else runs without it).
# The backbone, with a trained pooler or plain mean pooling, is an mteb encoder; local STS sets are mteb tasks.
# Results go to mteb's standard results folder.

def mteb_tasks(spec):
    """mteb tasks of --mteb, with their data loaded: local STS sets (paths, as --sts takes) or mteb task names."""
    mteb = optional("mteb", "--mteb")
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
                            "offline, pass a local STS set (e.g. --mteb=DIR/glue/STS-B)") from None
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
            name=name, revision=revision, embed_dim=model.config.n_embd, n_parameters=model.model.num_params(),
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
    # --help: this docstring, and each setting's comment, here or (the backbone's) in evaluation/features.py
    s = configure(settings, argv, help_from=[__file__, features_module.__file__])
    with user_errors("embed.py"):
        check(s)
        if s["texts"]:
            embed_file(s)
        else:
            run(s)


def check(s):
    """A UserError for settings that cannot go together or cannot run, before any file is read or written."""
    check_model_settings(s)
    if s["texts"]:
        if s["sts"] or s["beir"] or s["mteb"] or s["pairs"] or s["save_pooler"]:
            raise UserError("--texts only embeds: train and keep a pooler in a run of its own (--pairs, --save_pooler)")
        if not s["out_npy"]:
            raise UserError("--texts needs --out_npy=PATH, the .npy file to write")
    else:
        if s["load_pooler"] or s["out_npy"]:
            raise UserError("--load_pooler and --out_npy go with --texts=FILE")
        if not (s["sts"] or s["beir"] or s["mteb"]):
            raise UserError("nothing to evaluate: pass --sts=..., --beir=... and/or --mteb=... (or --texts=... to "
                            "embed)")
        if (s["unfreeze"] or s["save_pooler"]) and not s["pairs"]:
            raise UserError("--unfreeze and --save_pooler train on pairs: pass --pairs=...")
        if s["save_pooler"] and s["ckpt"] == "random":
            raise UserError("--save_pooler keeps a pooler for the backbone in --ckpt; pass a checkpoint, not random")
    if s["pooler"] not in POOLERS:
        raise UserError(f"--pooler={s['pooler']!r}: expected one of {', '.join(sorted(POOLERS))}")
    if s["temperature"] <= 0 or s["steps"] < 1:
        raise UserError(f"--temperature must be > 0 (got {s['temperature']}) and --steps at least 1 (got {s['steps']})")
    if s["pairs"] and s["batch_size"] < 2:  # InfoNCE's negatives are the batch's other pairs
        raise UserError(f"--batch_size={s['batch_size']}: contrastive training needs at least 2 pairs a batch")
    for option in ("out", "out_npy", "save_pooler"):  # outputs are checked before any work
        if s[option]:
            check_writable(s[option], f"--{option}", folder=False)
    if s["mteb"]:
        check_writable(s["mteb_out"], "--mteb_out")


def run(s):
    t_start = time.time()
    # read every evaluation set first, so a malformed file fails before any training
    sts = {k: v for path in filter(None, s["sts"].split(",")) for k, v in read_sts(path).items()}
    beir = {Path(path).name: read_beir(path) for path in filter(None, s["beir"].split(","))}
    mteb_sets = mteb_tasks(s["mteb"]) if s["mteb"] else None
    model, info = load_model(s)
    model_type, cfg = info["model_type"], model.config
    if s["pairs"] and next(pair_stream(s["pairs"], s["seed"], cfg.block_size), None) is None:
        raise UserError(f"--pairs={s['pairs']}: no pairs there")  # checked now, not after the zero-shot evaluation
    print(f"{model_type} {cfg.n_layer}x{cfg.n_embd}, {model.model.num_params() / 1e6:.1f}M params", file=sys.stderr)

    rows = []
    for name in ["zero-shot"] + ["frozen"] * bool(s["pairs"]) + ["unfrozen"] * s["unfreeze"]:
        t0, losses, pooler = time.time(), [], None
        if name != "zero-shot":  # the same pooler init and the same pairs for frozen and unfrozen
            torch.manual_seed(s["seed"])
            pooler = POOLERS[s["pooler"]](cfg.n_embd, cfg.n_head).to(s["device"])
            pairs = pair_stream(s["pairs"], s["seed"], cfg.block_size)
            losses = train(model, pooler, pairs, s["steps"], s["batch_size"], s["lr"], s["backbone_lr"],
                           s["temperature"], unfreeze=name == "unfrozen", log=name)
            if name == "frozen" and s["save_pooler"]:  # the frozen pooler goes with --ckpt as it is on disk
                save_pooler(s["save_pooler"], pooler, s["pooler"], cfg.n_embd, cfg.n_head, s["ckpt"])
                print(f"saved the {s['pooler']} pooler to {s['save_pooler']}", file=sys.stderr)
        t1 = time.time()
        scores = evaluate(model, pooler, sts, beir)
        if s["mteb"]:
            revision = "random" if s["ckpt"] == "random" else f"step-{info.get('step')}"
            scores.update(mteb_scores(model, pooler, mteb_sets, s["mteb_out"],
                                      f"{model_type}-{cfg.n_layer}x{cfg.n_embd}/{name}", revision))
        rows.append(dict(name=name if pooler is None else f"{name} ({s['pooler']} pooler)", scores=scores,
                         steps=len(losses), final_loss=losses[-1] if losses else None,
                         train_s=t1 - t0, eval_s=time.time() - t1))
        print(f"{rows[-1]['name']}: {scores}", file=sys.stderr)

    cols = list(rows[0]["scores"])
    print(f"| {model_type} {cfg.n_layer}x{cfg.n_embd} ({s['ckpt']}) | " + " | ".join(cols) + " | train s | eval s |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        print(f"| {r['name']} | " + " | ".join(f"{r['scores'][c]:.1f}" for c in cols)
              + f" | {r['train_s']:.0f} | {r['eval_s']:.0f} |")
    if s["out"]:
        with open(s["out"], "w") as f:
            json.dump(dict(args=s, model_type=model_type, model_args=vars(cfg), code=info["code"], rows=rows,
                           wall_s=time.time() - t_start), f, indent=2)


if __name__ == "__main__":
    main()
