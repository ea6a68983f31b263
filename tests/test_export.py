"""export.py: a checkpoint to a folder that transformers (and sentence-transformers) load, with the same features
as model.encode() and embed.py, and its tokenizer. The round trips skip without the optional extras; CI installs them.
The heads on the export (fill-mask, fine-tuning) are tests/test_hf_heads.py's."""
import ast
import json
import os
import sys

import pytest
import torch

import export
from conftest import ROOT, assert_one_line_error
from data.tokenizer import EOT, MASK, PAD, VOCAB_SIZE, encode, encode_masked, load_ranks
from embeddings.vectors import AttentionPooler, POOLERS, embed_texts, save_pooler
from evaluation.features import Backbone, pad, random_twin, tokenize
from model import MODELS, ModelConfig
from plumbing.checkpoint import save_checkpoint

PAPER = '"Separating Representation from Reconstruction Enables Scalable Text Encoders" (ICML 2026)'
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512)
TEXTS = ["A short one.", "", "Naïve café — 東京 emoji 🙂, and <unk> or <mask spelled out.",
         "word " * 60, "  leading spaces\tand tabs\nand a newline", "1234567 numbers 3.14159", "x"]


def write_ckpt(tmp_path, model_type="crossbert", seed=0):
    """A checkpoint of a tiny model with a compact vocabulary (a random map) and weights moved off their init; and
    the model with its map, which read GPT-2 ids as the export must."""
    torch.manual_seed(seed)
    model = MODELS[model_type](ModelConfig(model_type=model_type, **TINY))
    vocab_map = torch.randint(0, TINY["vocab_size"] - 3, (VOCAB_SIZE,))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / f"{model_type}.pt"
    save_checkpoint(path, dict(model=model.state_dict(), model_type=model_type, model_args=vars(model.config),
                               vocab_map=vocab_map, step=7))
    return path, Backbone(model, vocab_map).eval()


def write_pooler(tmp_path, kind, seed=0):
    torch.manual_seed(seed)
    pooler = POOLERS[kind](TINY["n_embd"], TINY["n_head"])
    with torch.no_grad():
        for p in pooler.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / f"{kind}-pooler.pt"
    save_pooler(path, pooler, kind, TINY["n_embd"], TINY["n_head"], "ckpt.pt")
    return path, pooler.eval()


def test_bpe_files_rebuild_gpt2s_merges():
    """Every token of more than one byte is one merge of two lower-ranked tokens, spelled in GPT-2's stand-ins."""
    ranks = load_ranks()
    vocab, merges = export.bpe_files(ranks)
    assert len(merges) == sum(len(t) > 1 for t in ranks) == 50000
    assert (vocab["<mask>"], vocab["<pad>"], vocab["<|endoftext|>"], vocab["<unk>"]) == (MASK, PAD, EOT, PAD + 1)
    assert vocab["Ġthe"] == encode(" the")[0] and vocab["hello"] == encode("hello")[0]
    show = export.byte_stand_ins()
    assert sorted(show.values()) == sorted(set(show.values())) and len(show) == 256  # a bijection of the bytes
    assert merges[0] == "Ġ t"  # GPT-2's first merge
    for line in merges[:2000]:
        a, b = line.split(" ")
        assert vocab[a] < vocab[a + b] and vocab[b] < vocab[a + b]


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
@pytest.mark.parametrize("encoder_only", [False, True])
def test_export_holds_the_model_or_the_encoder_only(encoder_only, tmp_path):
    """By default the whole trained model (encoder, and what fills masks) under model.py's names; with
    --encoder_only=True the encoder's tensors alone (no LM head, predictor or generator). Both hold the vocabulary
    map, and code that imports nothing from the project (the folder is used where the project is not)."""
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file
    for model_type in MODELS:
        path, backbone = write_ckpt(tmp_path, model_type)
        out = tmp_path / f"{model_type}-export"
        export.main([f"--ckpt={path}", f"--out={out}", f"--encoder_only={encoder_only}"])
        tensors = load_file(out / "model.safetensors")
        state = backbone.model.state_dict()
        want = {k for k in state if k.startswith(export.ENCODER_KEYS) or not encoder_only}
        assert set(tensors) == {f"model.{k}" for k in want} | {"vocab_map"}
        assert any(k.startswith(("model.predictor", "model.generator", "model.head")) for k in tensors) != encoder_only
        for k in want:
            assert torch.equal(tensors[f"model.{k}"], state[k])
        assert torch.equal(tensors["vocab_map"], backbone.vocab_map)
        config = json.loads((out / "config.json").read_text())
        assert config["trained_as"] == model_type and config["encoder"]["n_layer"] == TINY["n_layer"]
        assert config["encoder"]["model_type"] == "bert" and config["pooler"] is None
        assert config["vocab_size"] == VOCAB_SIZE and config["encoder"]["vocab_size"] == TINY["vocab_size"]
        assert config["masked_lm"] == (None if encoder_only else json.loads(json.dumps(vars(backbone.config))))
        code = (out / "model.py").read_text()
        assert "\nfrom .masking import " in code and "\nfrom masking import " not in code
        assert_self_contained(out)


def assert_self_contained(folder):
    """Every import of the folder's code is relative (its own files) or of a module outside the project."""
    project = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or p.is_dir()}
    names = [p.name for p in folder.glob("*.py")]
    assert {"modeling_crossbert.py", "model.py", "masking.py", "poolers.py"} <= set(names)
    for name in names:
        for node in ast.walk(ast.parse((folder / name).read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:  # level 1: `from .model import`, the folder's
                modules = [node.module]
            else:
                continue
            assert not {m.split(".")[0] for m in modules} & project, (name, modules)


@pytest.mark.slow
def test_export_of_a_random_twin(tmp_path):
    """--ckpt=random --like=CKPT writes features.random_twin(CKPT): its vocabulary map, fresh weights of --seed."""
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file
    path, backbone = write_ckpt(tmp_path)
    export.main(["--ckpt=random", f"--like={path}", "--seed=3", f"--out={tmp_path / 'twin'}"])
    tensors = load_file(tmp_path / "twin" / "model.safetensors")
    twin = random_twin(backbone, 3).model.state_dict()
    assert all(torch.equal(tensors[f"model.{k}"], v) for k, v in twin.items())
    assert torch.equal(tensors["vocab_map"], backbone.vocab_map)
    assert not torch.equal(twin["wte.weight"], backbone.model.wte.weight)
    trained = json.loads((tmp_path / "twin" / "config.json").read_text())["trained"]
    assert trained["ckpt"] == "random" and trained["like"] == str(path) and trained["seed"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("model_type,kind", [("crossbert", None), ("crossbert", "attn"), ("bert", "mean"),
                                             ("electra", None)])
def test_transformers_loads_the_export_with_the_same_features(model_type, kind, tmp_path):
    """AutoModel's states equal model.encode()'s on a padded batch, and its pooler_output equals embed.py's vectors
    (the saved pooler's, or mean pooling), within 1e-5 in fp32; AutoTokenizer gives data/tokenizer.py's ids."""
    transformers = pytest.importorskip("transformers")
    path, backbone = write_ckpt(tmp_path, model_type)
    pooler_path, pooler = write_pooler(tmp_path, kind) if kind else ("", None)
    out = tmp_path / "export"
    export.export(str(path), str(out), str(pooler_path))
    hf = transformers.AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    texts = [t for t in TEXTS if t]  # an empty text: tokenize() feeds a lone <|endoftext|>, the tokenizer nothing
    ids, _ = tokenize([(t,) for t in texts], TINY["block_size"])
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    ours, mask = pad(ids, "cpu")
    assert torch.equal(batch["input_ids"], ours) and torch.equal(batch["attention_mask"].bool(), mask)
    with torch.no_grad():
        got = hf(**batch)
        want = backbone.encode(ours, mask)
    m = mask[..., None]
    assert ((got.last_hidden_state - want) * m).abs().max() <= 1e-5
    assert (got.pooler_output - embed_texts(backbone, pooler, texts)).abs().max() <= 1e-5


@pytest.mark.slow
def test_the_tokenizer_reads_special_tokens_and_joins_pairs_as_features_py(tmp_path):
    """<mask> is the mask token, with the spaces before it (as sample.py's encode_masked reads it); <pad> and
    <|endoftext|> spelled in a text are those tokens too, as transformers' tokenizers read them; a pair is
    a <|endoftext|> b, cut to the block as features.tokenize() cuts it (the longer side first)."""
    transformers = pytest.importorskip("transformers")
    path, _ = write_ckpt(tmp_path)
    export.export(str(path), str(tmp_path / "export"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "export", trust_remote_code=True)
    assert (tok.mask_token_id, tok.pad_token_id, tok.sep_token_id) == (MASK, PAD, EOT)
    for text in ["Once upon a <mask>.", "a <mask> b<mask>  <mask>!", "<mask> starts, ends <mask>"]:
        assert tok(text)["input_ids"] == encode_masked(text)
    assert tok("a <pad> b <|endoftext|>")["input_ids"] == encode("a ") + [PAD] + encode(" b ") + [EOT]
    pairs = [("A short one.", "And another, a bit longer than it."), ("word " * 40, "x y"), ("a " * 10, "b " * 40),
             ("c " * 31, "d " * 30), ("", "z")]
    got = tok([a for a, _ in pairs], [b for _, b in pairs], truncation=True)["input_ids"]
    assert got == tokenize(pairs, TINY["block_size"])[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", [None, "attn"])
def test_sentence_transformers_encode_equals_embed_py(kind, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    path, backbone = write_ckpt(tmp_path)
    pooler_path, pooler = write_pooler(tmp_path, kind) if kind else ("", None)
    out = tmp_path / "export"
    export.export(str(path), str(out), str(pooler_path))
    texts = [t for t in TEXTS if t] * 5
    got = st.SentenceTransformer(str(out), trust_remote_code=True, device="cpu").encode(texts, convert_to_tensor=True,
                                                                                          batch_size=8)
    assert (got.cpu() - embed_texts(backbone, pooler, texts)).abs().max() <= 1e-5


def test_the_model_card_says_what_the_model_is_and_what_trained_it(tmp_path):
    """README.md: the family and size, the paper, loading with trust_remote_code, and from the checkpoint its data,
    steps, tokens, FLOPs and code; the val loss against the unigram baseline from the run's log.jsonl, when there."""
    path, backbone = write_ckpt(tmp_path, "electra")
    run = dict(model=backbone.model.state_dict(), model_type="electra", model_args=vars(backbone.config),
               vocab_map=backbone.vocab_map, config=dict(dataset="tinybooks"), step=300, tokens=921600, flops=9.49e12,
               code=dict(commit="b6d67f8", dirty=True))
    save_checkpoint(path, run)
    records = [dict(step=0, unigram_loss=6.0844), dict(step=100, val_loss=5.8), dict(step=300, val_loss=5.3575,
               probe={"SST-2/linear": 61.25, "SST-2/knn": 55.0}), dict(step=400, val_loss=5.1, probe={})]
    # a later record than the checkpoint's step is not its loss
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    card = export.model_card("exported/tiny", backbone, run, dict(ckpt=str(path)), False)
    for needle in ("pipeline_tag: fill-mask", "ELECTRA", "2 layers of width 32 with 2 heads", PAPER,
                   'AutoModel.from_pretrained("exported/tiny", trust_remote_code=True)', 'pipeline("fill-mask"',
                   "- data: tinybooks", "steps: 300; tokens: 921,600; training FLOPs: 9.49e+12",
                   "5.3575 nats, 0.727 nats below the unigram baseline's 6.0844", "commit b6d67f8 with uncommitted",
                   "at step 300, SST-2/linear 61.2, SST-2/knn 55.0"):
        assert needle in card, needle
    (tmp_path / "log.jsonl").unlink()
    card = export.model_card("exported/enc", backbone, {}, dict(ckpt=str(path)), True)
    assert "pipeline_tag: feature-extraction" in card and "fill-mask" not in card
    assert "- data: not recorded" in card and "not recorded (no log.jsonl beside the checkpoint)" in card
    assert "not recorded (train.py's probe_interval was 0)" in card


def test_bad_export_input_is_one_line_and_loses_nothing(tmp_path):
    path, _ = write_ckpt(tmp_path)
    assert_one_line_error(export.main, [f"--ckpt={tmp_path / 'nope.pt'}", f"--out={tmp_path / 'a'}"], "export.py",
                          "nope.pt", "no such checkpoint")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine.txt").write_text("precious")
    assert_one_line_error(export.main, [f"--ckpt={path}", f"--out={kept}"], "export.py", "already exists")
    assert [p.name for p in kept.iterdir()] == ["mine.txt"] and (kept / "mine.txt").read_text() == "precious"
    wide = tmp_path / "wide.pt"
    save_pooler(wide, AttentionPooler(64, 2), "attn", 64, 2, "big/ckpt.pt")
    assert_one_line_error(export.main, [f"--ckpt={path}", f"--pooler={wide}", f"--out={tmp_path / 'b'}"],
                          "export.py", "64 dims", "big/ckpt.pt")
    assert_one_line_error(export.main, [f"--like={path}", f"--out={tmp_path / 'c'}"], "export.py",
                          "--ckpt=random and --like=CKPT go together")
    assert sorted(os.listdir(tmp_path)) == sorted(["crossbert.pt", "kept", "wide.pt"])  # no folder half-written


def test_export_without_safetensors_is_one_line(tmp_path, monkeypatch):
    path, _ = write_ckpt(tmp_path)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors fails, as where it is not installed
    assert_one_line_error(export.main, [f"--ckpt={path}", f"--out={tmp_path / 'out'}"], "export.py",
                          "export needs safetensors, which is not installed: pip install safetensors")
    assert not (tmp_path / "out").exists()


def test_export_without_sentence_transformers_still_loads_in_transformers(tmp_path, monkeypatch, capsys):
    pytest.importorskip("safetensors")
    path, _ = write_ckpt(tmp_path)
    for name in [m for m in sys.modules if m.startswith("sentence_transformers")] + ["sentence_transformers"]:
        monkeypatch.setitem(sys.modules, name, None)  # not installed (nor imported by an earlier test)
    export.main([f"--ckpt={path}", f"--out={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert 'pip install "sentence-transformers>=6" "torch==2.13.0"; then export again' in err
    assert "AutoModel.from_pretrained" in out and "SentenceTransformer" not in out
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out" / "modules.json").exists()
