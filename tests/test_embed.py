import gzip
import json
import math
import sys

import numpy as np
import pytest
import torch

import embed
from plumbing.checkpoint import code_version, save_checkpoint
from conftest import assert_one_line_error
from data.pairs import crop_pairs, pair_stream, text_pairs
from data.tasks import read_beir, read_sts
from data.tokenizer import EOT, decode, encode
from embeddings.vectors import MeanPooler, POOLERS, embed_texts, load_pooler, save_pooler
from evaluation.features import features, mean_pool, tokenize
from model import CrossBERT, ModelConfig

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return CrossBERT(ModelConfig(**TINY)).eval()


def random_pairs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(list(rng.integers(0, 50000, rng.integers(3, 12))), list(rng.integers(0, 50000, rng.integers(3, 12))))
            for _ in range(n)]


def test_info_nce_matches_hand_computation():
    rng = np.random.default_rng(0)
    a, b, tau = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), 0.1
    unit = lambda v: v / math.sqrt(sum(x * x for x in v))
    A, B = [unit(v) for v in a], [unit(v) for v in b]
    sim = [[sum(x * y for x, y in zip(A[i], B[j])) / tau for j in range(3)] for i in range(3)]

    def ce(row, target):  # -log softmax(row)[target]
        return -row[target] + math.log(sum(math.exp(x) for x in row))

    a_to_b = sum(ce(sim[i], i) for i in range(3)) / 3
    b_to_a = sum(ce([sim[j][i] for j in range(3)], i) for i in range(3)) / 3
    got = embed.info_nce(torch.tensor(a), torch.tensor(b), tau).item()
    assert got == pytest.approx((a_to_b + b_to_a) / 2, rel=1e-9)


@pytest.mark.parametrize("kind", ["mean", "attn"])
def test_fresh_pooler_is_mean_pooling_and_ignores_padding(kind):
    torch.manual_seed(0)
    pooler = POOLERS[kind](32, 2)
    h, mask = torch.randn(2, 5, 32), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    z = pooler(h, mask)
    assert torch.allclose(z, mean_pool(h, mask), atol=1e-6)
    assert torch.allclose(z[0], h[0, :3].mean(0), atol=1e-6)
    with torch.no_grad():  # a trained query still ignores padded tokens
        for p in pooler.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert torch.allclose(pooler(h[:1], mask[:1]), pooler(h[:1, :3], mask[:1, :3]), atol=1e-5)


@pytest.mark.parametrize("kind", ["mean", "attn"])
def test_frozen_training_touches_only_the_pooler(kind):
    model = tiny_model()
    before = {n: p.clone() for n, p in model.named_parameters()}
    pooler = POOLERS[kind](32, 2)
    pooler_before = [p.clone() for p in pooler.parameters()]
    losses = embed.train(model, pooler, iter(random_pairs(24)), steps=3, batch_size=8, lr=1e-2, backbone_lr=1e-2,
                         temperature=0.05, unfreeze=False)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.grad is None, n
    assert all(not torch.equal(p, q) for p, q in zip(pooler.parameters(), pooler_before))


def test_unfrozen_training_changes_the_backbone():
    model = tiny_model()
    before = {n: p.clone() for n, p in model.named_parameters()}
    embed.train(model, MeanPooler(32, 2), iter(random_pairs(16)), steps=2, batch_size=8, lr=1e-2,
                backbone_lr=1e-2, temperature=0.05, unfreeze=True)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "blocks.0.attn.q.weight" in changed and "wte.weight" in changed


def test_ndcg_and_recall_match_hand_computation():
    qrel = {"d1": 3, "d2": 1, "d5": 2}  # graded relevance; d5 is never retrieved in the top 3
    ranked = ["d2", "d9", "d1", "d5"]
    dcg = 1 / math.log2(2) + 3 / math.log2(4) + 2 / math.log2(5)
    idcg = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert embed.ndcg_at_k(ranked, qrel, 10) == pytest.approx(dcg / idcg)
    assert embed.ndcg_at_k(ranked, qrel, 1) == pytest.approx(1 / 3)  # ideal top-1 gain is 3
    assert embed.ndcg_at_k(["d1", "d5", "d2"], qrel, 10) == pytest.approx(1.0)
    assert embed.recall_at_k(ranked, qrel, 3) == pytest.approx(2 / 3)
    assert embed.recall_at_k(ranked, qrel, 100) == pytest.approx(1.0)
    assert embed.recall_at_k(["d9"], qrel, 100) == 0.0


def write_beir(folder, corpus, queries, qrels):
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "qrels/test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in qrels))


def test_retrieval_finds_identical_text(tmp_path):
    words = "apple river stone cloud violin garden engine pepper island letter candle mirror".split()
    docs = [" ".join(words[i:i + 4]) for i in range(9)]
    write_beir(tmp_path, [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(docs)],
               [{"_id": "q1", "text": docs[2]}, {"_id": "q2", "text": docs[7]}, {"_id": "q3", "text": "x"}],
               [("q1", "d2", 1), ("q2", "d7", 2), ("q3", "d0", 0)])
    corpus, queries, qrels = read_beir(tmp_path)
    assert corpus["d2"] == docs[2] and set(qrels) == {"q1", "q2"}  # q3 has no relevant doc: not scored
    scores = embed.eval_retrieval(tiny_model(), None, (corpus, queries, qrels))
    assert scores == {"ndcg@10": pytest.approx(100.0), "recall@100": pytest.approx(100.0)}


@pytest.mark.parametrize("name, text, line", [
    ("corpus.jsonl", '{"_id": "d0", "text": "a"}\n{"_id": "d1", "text": \n', 2),
    ("corpus.jsonl", '{"_id": "d0", "text": "a"}\n{"_id": "d1"}\n', 2),
    ("queries.jsonl", '["q1", "text"]\n', 1),
    ("qrels/test.tsv", "query\tdoc\tscore\nq1\td0\t1\n", 1),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td0\t1\nq1\td0\n", 3),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td0\thigh\n", 2),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq7\td0\t1\n", 2),
])
def test_beir_reader_rejects_malformed_files(tmp_path, name, text, line):
    write_beir(tmp_path, [{"_id": "d0", "text": "a"}], [{"_id": "q1", "text": "b"}], [("q1", "d0", 1)])
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"{name}:{line}: .*fix"):
        read_beir(tmp_path)
    (tmp_path / name).unlink()
    with pytest.raises(ValueError, match=f"no {name}"):
        read_beir(tmp_path)


def test_sts_readers(tmp_path):
    glue = tmp_path / "STS-B"
    glue.mkdir()
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    (glue / "dev.tsv").write_text(head + '0\tg\tf\ty\t0\tnone\tnone\tA "quoted\tB\t4.5\n')
    assert read_sts(glue) == {"STS-B": [('A "quoted', "B", 4.5)]}  # a quote is text, not quoting
    semeval = tmp_path / "semeval"
    semeval.mkdir()
    (semeval / "a.txt").write_text("1.0\tx\ty\n\n3\tu\tv\n")
    assert read_sts(semeval) == {"semeval/a": [("x", "y", 1.0), ("u", "v", 3.0)]}


@pytest.mark.parametrize("layout, text, message", [  # the GLUE tasks' TSV reader reads both layouts
    ("glue", "index\tsentence1\tsentence2\tscore\n0\ta\tb\t1\n1\ta\tb\n", ":3: 3 tab-separated fields.*fix"),
    ("glue", "index\tsentence1\tsentence2\tscore\n0\ta\tb\tfive\n", ": label 'five' is not a finite number; fix"),
    ("glue", "index\ts1\ts2\tlabel\n0\ta\tb\t1\n", " has no column 'sentence1'.*rename"),
    ("semeval", "1\ta\tb\n2\ta b\n", ":2: 2 tab-separated fields.*fix"),
    ("semeval", "1\ta\tb\n\nn/a\ta\tb\n", ": label 'n/a' is not a finite number; fix"),
])
def test_sts_readers_reject_malformed_files(tmp_path, layout, text, message):
    path = tmp_path / ("dev.tsv" if layout == "glue" else "sts.tsv")
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path.name}{message}"):
        read_sts(tmp_path if layout == "glue" else path)


def test_crops_are_two_spans_of_one_document(tmp_path):
    docs = [" ".join(f"{w}{i}" for i in range(200)) for w in ("alpha", "beta", "gamma")]
    with gzip.open(tmp_path / "part.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": docs[0]}) + "\n" + json.dumps({"text": docs[1]}) + "\n")
    (tmp_path / "book.txt").write_text(docs[2])
    pairs = list(crop_pairs(tmp_path, seed=0, passage=32))
    assert len(pairs) == 3
    sources = []
    for a, b in pairs:
        ta, tb = decode(a), decode(b)
        assert 3 <= len(a) <= 16 and 3 <= len(b) <= 16  # 10-50% of a 32-token passage
        home = [i for i, d in enumerate(docs) if ta in d]
        assert len(home) == 1 and tb in docs[home[0]]
        sources.append(home[0])
    assert sources == [2, 0, 1]  # book.txt, then the two documents of part.jsonl.gz
    assert pairs == list(crop_pairs(tmp_path, seed=0, passage=32))
    assert pairs != list(crop_pairs(tmp_path, seed=1, passage=32))


def test_pair_files(tmp_path):
    (tmp_path / "p.tsv").write_text("what is a cat\ta small animal\textra\n\nsky\tblue\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": 3, "query": "sky", "pos": "blue"}) + "\n")
    got = list(pair_stream(str(tmp_path / "p.tsv"), seed=0, max_len=3))
    assert sorted(got) == sorted([(encode("what is a cat")[:3], encode("a small animal")[:3]), (encode("sky"), encode("blue"))])
    assert list(text_pairs(str(tmp_path / "p.jsonl"))) == [("sky", "blue")]
    (tmp_path / "bad.tsv").write_text("a\tb\nonly one\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: .*fix"):
        list(text_pairs(str(tmp_path / "bad.tsv")))


def test_command_line(tmp_path, capsys):
    (tmp_path / "sts.tsv").write_text("".join(f"{i % 5}\tsentence number {i}\tsentence {i * 7 % 11}\n" for i in range(20)))
    (tmp_path / "pairs.tsv").write_text("".join(f"question {i}\tanswer {i}\n" for i in range(40)))
    write_beir(tmp_path / "toy", [{"_id": f"d{i}", "title": "t", "text": f"doc {i}"} for i in range(30)],
               [{"_id": "q0", "text": "doc 3"}], [("q0", "d3", 1)])
    size = [f"--{k}={v}" for k, v in TINY.items()]
    embed.main(["--ckpt=random", *size, f"--sts={tmp_path / 'sts.tsv'}", f"--beir={tmp_path / 'toy'}",
                f"--pairs={tmp_path / 'pairs.tsv'}", "--steps=2", "--batch_size=8", "--unfreeze",
                f"--out={tmp_path / 'out.json'}"])
    out = json.loads((tmp_path / "out.json").read_text())
    assert [r["name"] for r in out["rows"]] == ["zero-shot", "frozen (attn pooler)", "unfrozen (attn pooler)"]
    assert set(out["rows"][0]["scores"]) == {"sts", "toy/ndcg@10", "toy/recall@100"}
    assert out["rows"][1]["steps"] == 2 and out["rows"][2]["steps"] == 2
    assert out["code"] == code_version()
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| crossbert 2x32 (random) | sts | toy/ndcg@10 | toy/recall@100 |") and len(table) == 5


def test_hub_pairs_take_the_first_two_text_columns(monkeypatch):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return [{"query": "what is rain", "positive": "water falling", "negative": "a dry desert"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert list(text_pairs("hf:org/msmarco:triplet")) == [("what is rain", "water falling")]
    assert calls == [("org/msmarco", "triplet", "train", True)]


def test_mteb_without_mteb_installed_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mteb", None)  # import mteb fails, as where it is not installed
    (tmp_path / "sts.tsv").write_text("1\ta\tb\n2\tc\td\n")
    args = ["--ckpt=random", *[f"--{k}={v}" for k, v in TINY.items()], f"--mteb={tmp_path / 'sts.tsv'}",
            f"--mteb_out={tmp_path / 'mteb'}"]
    assert_one_line_error(embed.main, args, "embed.py", '--mteb needs mteb, which is not installed: pip install mteb '
                          '"torch==2.13.0"')
    assert not (tmp_path / "mteb").exists()


@pytest.mark.parametrize("flag, needles", [
    ("--sts=no/such/sts", ["--sts=no/such/sts: no STS-B dev.tsv"]),
    ("--pairs=crop:no/such/corpus", ["--pairs=crop:no/such/corpus: no corpus there", ".jsonl"]),
])
def test_command_line_errors_are_one_line(tmp_path, flag, needles):
    (tmp_path / "sts.tsv").write_text("1\ta\tb\n2\tc\td\n")
    args = ["--ckpt=random", *[f"--{k}={v}" for k, v in TINY.items()], f"--sts={tmp_path / 'sts.tsv'}", flag]
    assert_one_line_error(embed.main, args, "embed.py", *needles)


# ----------------------------------------------------------------------------
# Keeping a pooler (--save_pooler) and embedding a file of texts with it (--texts)

LINES = ["A cat sits on the mat.", "", "Stocks fell sharply today, and the bank's shares fell most of all.",
         "Rain.", "naïve café – ünïcode", "He ate rice with his friends at the old house by the river last night."]


def saved_backbone(folder):
    model = tiny_model()
    path = folder / "ckpt.pt"
    save_checkpoint(path, dict(model=model.state_dict(), model_type="crossbert", model_args=vars(model.config),
                               vocab_map=None))
    return model, path


def trained_pooler(kind):
    """A pooler moved away from its mean-pooling init by a few steps of training on a tiny model."""
    pooler = POOLERS[kind](32, 2)
    embed.train(tiny_model(), pooler, iter(random_pairs(24)), steps=3, batch_size=8, lr=1e-2, backbone_lr=0.0,
                temperature=0.05, unfreeze=False)
    return pooler


def by_hand(model, pooler, text):
    """One text alone through encode() and the pooler (or a plain mean), unit-norm: no batching, no sorting."""
    with torch.no_grad():
        h = model.encode(torch.tensor([encode(text)[:model.config.block_size] or [EOT]]))
        z = h.mean(1) if pooler is None else pooler(h, torch.ones(h.shape[:2], dtype=torch.bool))
    return torch.nn.functional.normalize(z[0], dim=-1)


@pytest.mark.parametrize("kind", ["mean", "attn"])
def test_saved_pooler_gives_the_same_vectors(kind, tmp_path):
    model, pooler = tiny_model(), trained_pooler(kind)
    save_pooler(tmp_path / "pooler.pt", pooler, kind, 32, 2, "out/ckpt.pt")
    loaded, saved = load_pooler(tmp_path / "pooler.pt", "--load_pooler")
    assert (saved["kind"], saved["n_embd"], saved["n_head"], saved["ckpt"]) == (kind, 32, 2, "out/ckpt.pt")
    assert type(loaded) is type(pooler) and not (tmp_path / "pooler.pt.tmp").exists()
    texts = LINES * 3
    before, after = embed_texts(model, pooler, texts), embed_texts(model, loaded, texts)
    assert (before - after).abs().max() <= 1e-6
    assert (before - embed_texts(model, None, texts)).abs().max() > 1e-3  # trained: not plain mean pooling


@pytest.mark.parametrize("kind", ["mean", "attn", None])
def test_texts_command_writes_one_row_per_line_in_order(kind, tmp_path):
    model, ckpt = saved_backbone(tmp_path)
    pooler = trained_pooler(kind) if kind else None
    args = [f"--ckpt={ckpt}", f"--texts={tmp_path / 'in.txt'}", f"--out_npy={tmp_path / 'out.npy'}"]
    if kind:
        save_pooler(tmp_path / "pooler.pt", pooler, kind, 32, 2, ckpt)
        args.append(f"--load_pooler={tmp_path / 'pooler.pt'}")
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n")  # a blank line is a text too: row i is line i
    embed.main(args)
    z = np.load(tmp_path / "out.npy")
    assert z.dtype == np.float32 and z.shape == (len(LINES), 32)
    for i, line in enumerate(LINES):  # each row is its own line's vector, computed alone
        assert np.abs(z[i] - by_hand(model, pooler, line).numpy()).max() <= 1e-5, i
    ids, _ = tokenize([(t,) for t in LINES], 32)
    direct = features(model, ids, pool=pooler or mean_pool)[2]
    direct = torch.nn.functional.normalize(torch.from_numpy(direct), dim=-1)
    assert np.abs(z - direct.numpy()).max() <= 1e-6  # mean pooling without a pooler: evaluation/features.py's mean-pooled features
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "body": t}) + "\n\n" for i, t in enumerate(LINES)))
    embed.main([a.replace("in.txt", "in.jsonl") for a in args] + ["--text_key=body"])  # blank .jsonl lines are skipped
    assert np.array_equal(np.load(tmp_path / "out.npy"), z)
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(LINES).encode() + b"\r\n")  # a BOM, CRLF
    embed.main(args)
    assert np.array_equal(np.load(tmp_path / "out.npy"), z)


def test_a_trained_pooler_is_kept_and_used(tmp_path):
    model, ckpt = saved_backbone(tmp_path)
    (tmp_path / "sts.tsv").write_text("".join(f"{i % 5}\tsentence number {i}\tsentence {i * 7 % 11}\n" for i in range(20)))
    (tmp_path / "pairs.tsv").write_text("".join(f"question {i}\tanswer {i}\n" for i in range(40)))
    embed.main([f"--ckpt={ckpt}", f"--sts={tmp_path / 'sts.tsv'}", f"--pairs={tmp_path / 'pairs.tsv'}", "--steps=2",
                "--batch_size=8", "--unfreeze", f"--save_pooler={tmp_path / 'pooler.pt'}"])
    pooler, saved = load_pooler(tmp_path / "pooler.pt", "--load_pooler")
    assert (saved["kind"], saved["ckpt"]) == ("attn", str(ckpt))  # the frozen row's pooler, for --ckpt as it is
    (tmp_path / "in.txt").write_text("\n".join(LINES))
    embed.main([f"--ckpt={ckpt}", f"--load_pooler={tmp_path / 'pooler.pt'}", f"--texts={tmp_path / 'in.txt'}",
                f"--out_npy={tmp_path / 'out.npy'}"])
    z = np.load(tmp_path / "out.npy")
    assert np.abs(z - embed_texts(model, pooler, LINES).numpy()).max() <= 1e-6
    assert np.abs(z - embed_texts(model, None, LINES).numpy()).max() > 1e-3
