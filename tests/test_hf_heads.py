"""hf/modeling_crossbert.py's heads on an export: pipeline("fill-mask") fills each family's masks as sample.py does, a
padded batch fills each row as it is filled alone, and the task heads keep transformers' conventions and train under its
Trainer (hf/finetune.py). Those that need transformers are slow, as the export's round trips are (RUN_SLOW=1)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import export
import finetune
import sample
from conftest import assert_one_line_error, tiny_tasks
from data.tokenizer import MASK, VOCAB_SIZE, compact_vocab
from evaluation.features import Backbone, mean_pool, pad, tokenize
from masking import Views
from model import MODELS, ModelConfig
from plumbing.checkpoint import save_checkpoint

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=48)
TEXT = "Once upon a <mask>, the old <mask> sat by the sea and <mask> at the sky."


def write_ckpt(tmp_path, model_type, vocab_size=512, seed=0):
    """A checkpoint of a tiny model with weights moved off their init, and a compact vocabulary as train.py makes one
    (the most frequent ids, of random counts here) whose <unk> row is made a likely fill, so that it is among the top
    5; vocab_size=0: GPT-2's full vocabulary. And the model with its map, which read GPT-2 ids as the export must."""
    torch.manual_seed(seed)
    model = MODELS[model_type](ModelConfig(model_type=model_type, vocab_size=vocab_size or VOCAB_SIZE, **TINY))
    vocab_map = None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if vocab_size:
            counts = np.random.default_rng(seed).integers(0, 1000, VOCAB_SIZE)
            vocab_map = torch.from_numpy(compact_vocab(counts, vocab_size))
            model.decoder_bias[vocab_size - 3] += 2.0  # compact_vocab's <unk> row
    path = tmp_path / f"{model_type}.pt"
    save_checkpoint(path, dict(model=model.state_dict(), model_type=model_type, model_args=vars(model.config),
                               vocab_map=vocab_map, step=7))
    return path, Backbone(model, vocab_map).eval()


def exported(tmp_path, model_type, vocab_size=512, **kwargs):
    path, model = write_ckpt(tmp_path, model_type, vocab_size)
    out = tmp_path / f"{model_type}-export"
    export.export(str(path), str(out), **kwargs)
    return str(out), model


@pytest.mark.slow
@pytest.mark.parametrize("model_type,vocab_size", [("bert", 512), ("crossbert", 512), ("electra", 512),
                                                   ("crossbert", 0)])
def test_fill_mask_pipeline_gives_sample_pys_fills(model_type, vocab_size, tmp_path):
    """Each <mask>'s top 5 fills, their tokens and probabilities (within 1e-5), as sample.py --text computes them on
    the checkpoint: from the same ids, with the same views (the <mask>s the targets, the rest visible)."""
    transformers = pytest.importorskip("transformers")
    out, model = exported(tmp_path, model_type, vocab_size)
    fill = transformers.pipeline("fill-mask", model=out, trust_remote_code=True)
    got = fill(TEXT, top_k=5)
    ids = sample.masked(TEXT, model.config.block_size, False)
    assert fill.tokenizer(TEXT)["input_ids"] == ids
    where = [i for i, t in enumerate(ids) if t == MASK]
    seen = [i for i in range(len(ids)) if i not in where]
    views = Views(torch.zeros(1, dtype=torch.long), torch.tensor([seen]), torch.tensor([where]))  # as fill_masks()
    with torch.no_grad():  # sample.fills(): the softmax of model.fill() over the rows a text can hold
        logits = model.model.fill(model.ids(torch.tensor([ids]))[views.rows], views)
    probs = logits[..., :model.config.mask_token_id].float().softmax(-1)
    row_text, shown = sample.row_texts(model), []
    assert len(got) == len(where) == 3
    for p, fills in zip(probs[0], got):
        q, rows = p.topk(5)
        assert [f["token_str"] for f in fills] == [row_text(r) for r in rows.tolist()]
        assert max(abs(f["score"] - v) for f, v in zip(fills, q.tolist())) <= 1e-5
        # each fill's token: the one id whose row it is, or <unk>, the name of a row many rare ids share
        for f, r in zip(fills, rows.tolist()):
            unk = f["token_str"] == "<unk>"
            assert f["token"] == export.UNK if unk else model.ids(torch.tensor(f["token"])) == r
        shown += [f["token_str"] for f in fills]
    assert ("<unk>" in shown) == bool(vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", MODELS)
def test_a_padded_batch_fills_each_row_as_alone(model_type, tmp_path):
    """Rows with different numbers of tokens and of <mask>s (none, too), padded into one batch: each row's logits
    equal those it gets alone (1e-5), and positions other than its <mask>s are zero. Without the attention mask the
    padding would change them (what the test would see if the padding reached any attention)."""
    transformers = pytest.importorskip("transformers")
    out, _ = exported(tmp_path, model_type)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    texts = [TEXT, "The <mask> barked.", "No mask in this one, only words to read.", "<mask> <mask> went up the hill."]
    batch = tok(texts, padding=True, return_tensors="pt")
    masks = (batch["input_ids"] == MASK).sum(1).tolist()
    assert masks == [3, 1, 0, 2] and len(set(batch["attention_mask"].sum(1).tolist())) == 4
    with torch.no_grad():
        together = mlm(**batch).logits
        unmasked = mlm(input_ids=batch["input_ids"]).logits
        for i, text in enumerate(texts):
            alone = mlm(**tok([text], return_tensors="pt")).logits[0]
            n = len(alone)
            torch.testing.assert_close(together[i, :n], alone, atol=1e-5, rtol=0)
            assert (together[i, n:] == 0).all() and (alone[batch["input_ids"][i, :n] != MASK] == 0).all()
    short = batch["input_ids"][1] == MASK
    assert (together[1, short].softmax(-1) - unmasked[1, short].softmax(-1)).abs().max() > 1e-4


@pytest.mark.slow
def test_an_encoder_only_export_fills_no_mask(tmp_path):
    transformers = pytest.importorskip("transformers")
    out, model = exported(tmp_path, "crossbert", encoder_only=True)
    with pytest.raises(ValueError, match="holds the encoder alone.*hf/export.py wrote without --encoder_only"):
        transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True)
    hf = transformers.AutoModel.from_pretrained(out, trust_remote_code=True)
    ids = torch.tensor([[464, 3290, 318, 922]])
    with torch.no_grad():
        assert (hf(input_ids=ids).last_hidden_state - model.encode(ids)).abs().max() <= 1e-5
    assert not any(k.startswith(("model.head", "model.decoder_bias")) for k in hf.state_dict())  # no LM head


@pytest.mark.slow
@pytest.mark.parametrize("num_labels,labels,problem,loss", [
    (3, torch.tensor([0, 2, 1]), "single_label_classification", lambda z, y: F.cross_entropy(z, y)),
    (1, torch.tensor([0.5, 4.0, 2.5]), "regression", lambda z, y: F.mse_loss(z[:, 0], y)),
    (3, torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 1]]), "multi_label_classification",
     lambda z, y: F.binary_cross_entropy_with_logits(z, y)),
])
def test_the_sequence_head_keeps_transformers_conventions(num_labels, labels, problem, loss, tmp_path):
    """A linear head on the export's pooling of the trained encoder (mean pooling here); the loss by problem_type,
    which the labels set when the config has none (num_labels=1: regression; integer labels: single-label)."""
    transformers = pytest.importorskip("transformers")
    out, model = exported(tmp_path, "bert")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True,
                                                                        num_labels=num_labels).eval()
    texts = ["A short one.", "And a longer one, with a few more words.", "x"]
    ids, mask = pad(tokenize([(t,) for t in texts], TINY["block_size"])[0], "cpu")
    with torch.no_grad():
        got = hf(input_ids=ids, attention_mask=mask.long(), labels=labels)
        want = hf.classifier(mean_pool(model.encode(ids, mask), mask))
    assert hf.config.problem_type == problem and got.logits.shape == (3, num_labels)
    assert (got.logits - want).abs().max() <= 1e-5 and abs(got.loss - loss(want, labels)) <= 1e-5
    assert hf.classifier.bias.abs().max() == 0 and 0.01 < hf.classifier.weight.std() < 0.04  # new: model.py's init


@pytest.mark.slow
def test_the_token_head_skips_labels_of_minus_100(tmp_path):
    transformers = pytest.importorskip("transformers")
    out, model = exported(tmp_path, "electra")
    hf = transformers.AutoModelForTokenClassification.from_pretrained(out, trust_remote_code=True, num_labels=4).eval()
    ids, mask = pad(tokenize([("A short one.",), ("And a longer one, with more words.",)], 32)[0], "cpu")
    labels = torch.randint(0, 4, ids.shape).masked_fill(~mask, -100)
    with torch.no_grad():
        got = hf(input_ids=ids, attention_mask=mask.long(), labels=labels)
        want = hf.classifier(model.encode(ids, mask))
    assert (got.logits - want).abs().max() <= 1e-5
    assert abs(got.loss - F.cross_entropy(want[mask], labels[mask])) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("freeze", [False, True])
def test_finetune_trains_under_the_trainer(freeze, tmp_path):
    """hf/finetune.py on a task a bag of words separates: the loss goes down and dev gets it right; with
    --freeze=True the encoder is left as exported and the head alone learns. The fine-tuned folder loads again."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    out, model = exported(tmp_path, "crossbert", vocab_size=0)  # the task's words: no <unk> among them
    task = tiny_tasks(tmp_path).split(",")[0]
    history = finetune.finetune(dict(finetune.settings, model=out, task=task, epochs=5, batch_size=8,
                                     learning_rate=3e-3, freeze=freeze, out=str(tmp_path / "ft")))
    losses = [r["loss"] for r in history if "loss" in r]
    assert losses[-1] < 0.75 * losses[0] and history[-2]["eval_score"] == 100.0
    tuned = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ft", trust_remote_code=True)
    wte = tuned.crossbert.model.wte.weight
    assert torch.equal(wte, model.model.wte.weight) == freeze
    assert torch.equal(tuned.crossbert.vocab_map, torch.arange(VOCAB_SIZE))  # saved with it: the same ids
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["problem_type"] == "single_label_classification"
    assert tuned.config.id2label == {0: "a", 1: "b"} and tuned.config.label2id == {"a": 0, "b": 1}  # the task's
    with pytest.raises(ValueError, match="holds the encoder alone"):  # its save fills no mask (it filled NaN)
        transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "ft", trust_remote_code=True)


def test_bad_finetune_input_is_one_line(tmp_path):
    assert_one_line_error(finetune.main, [f"--out={tmp_path / 'ft'}"], "finetune.py", "--model=FOLDER is needed")
    assert_one_line_error(finetune.main, [f"--model={tmp_path}", f"--out={tmp_path / 'ft'}"], "finetune.py",
                          "is not an exported folder", "python hf/export.py")
    model = tmp_path / "export"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert_one_line_error(finetune.main, [f"--model={model}", f"--out={model}", "--overwrite=True"], "finetune.py",
                          "--out", "is --model", "would replace the export")
    assert_one_line_error(finetune.main, [f"--model={model}", f"--out={model}/"], "finetune.py", "is --model")
    kept = tmp_path / "kept"
    kept.mkdir()
    assert_one_line_error(finetune.main, [f"--model={model}", f"--out={kept}"], "finetune.py", "already exists",
                          "--overwrite=True")
    assert_one_line_error(finetune.main, [f"--model={model}", f"--out={tmp_path / 'ft'}", "--task=SST-2",
                                          f"--glue_dir={tmp_path / 'nope'}"], "finetune.py", "nope",
                          "dev.tsv there, or pick another --task")
    assert list(kept.iterdir()) == [] and [p.name for p in model.iterdir()] == ["config.json"]
