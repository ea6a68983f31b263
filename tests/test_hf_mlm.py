"""hf/modeling_crossbert.py's conventions of transformers: AutoModelForMaskedLM's loss with labels (continued
pretraining) is training's own on the same masks, no class loads a folder that lacks its weights, hidden states are
encode()'s layers, added tokens get rows of their own, activation checkpointing changes no gradient, and what SDPA
cannot give is refused in one line. They load the export with transformers, whose
import alone takes seconds: all slow (RUN_SLOW=1)."""
import pytest
import torch

import export
from data.tokenizer import MASK, PAD
from masking import Views
from test_hf_heads import exported, write_ckpt

pytestmark = pytest.mark.slow


def export_model(tmp_path, model_type, encoder_only=False):
    """The export's model files alone (config, weights, code: what the model classes read), and the checkpoint's
    model with its map."""
    path, model = write_ckpt(tmp_path, model_type)
    out = tmp_path / f"{model_type}-export"
    out.mkdir()
    export.write_model(out, model, dict(ckpt=str(path)), None, None, encoder_only)
    return out, model


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_the_mlm_loss_of_labels_is_trainings_on_the_same_masks(model_type, tmp_path):
    """labels (-100 off the targets) give model.py's objective on the same views within 1e-5, whatever the input
    holds at the targets (BERT's 80/10/10: <mask>, a random id or the token), and a gradient to what fills masks."""
    transformers = pytest.importorskip("transformers")
    out, model = export_model(tmp_path, model_type)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    B, T = 3, model.config.block_size
    g = torch.Generator().manual_seed(0)
    kept = (model.vocab_map < model.config.vocab_size - 3).nonzero()[:, 0]  # ids with rows of their own, not <unk>
    ids = kept[torch.randint(0, len(kept), (B, T), generator=g)]
    order = torch.rand(B, T, generator=g).argsort(1)
    views = Views(torch.arange(B), order[:, :30].sort(1).values, order[:, 30:].sort(1).values)
    u = torch.rand(views.target_pos.shape, generator=g) * (0.8 if model_type == "electra" else 1)
    noise = kept[torch.randint(0, len(kept), u.shape, generator=g)]
    at = ids.gather(1, views.target_pos)
    shown = torch.where(u < 0.8, MASK, torch.where(u < 0.9, noise, at))  # masking.corrupt's rule, on GPT-2 ids
    labels = torch.full_like(ids, -100).scatter(1, views.target_pos, at)
    torch.manual_seed(1)  # ELECTRA's samples: its u, the same in both
    got = mlm(input_ids=ids.scatter(1, views.target_pos, shown), labels=labels)
    torch.manual_seed(1)
    rows = model.ids(ids)
    draws = (u, model.ids(noise)) if model_type == "bert" else (torch.rand(u.shape),) if model_type == "electra" else ()
    with torch.no_grad():
        want, _ = model.model.objective(rows, views, *draws)
    assert abs(got.loss.item() - want.item()) <= 1e-5 * max(1, want.item())
    got.loss.backward()
    filler = getattr(mlm.model, dict(bert="head", crossbert="predictor", electra="generator")[model_type])
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in filler.parameters())
    assert got.logits.shape == (B, T, len(mlm.vocab_map)) and (got.logits[labels == -100] == 0).all()
    if model_type == "crossbert":  # a text of <mask>s alone: one line, not an IndexError
        with pytest.raises(ValueError, match="nothing to see"):
            mlm(input_ids=torch.full((1, 5), MASK))


def test_no_folder_loads_without_the_weights_it_needs(tmp_path):
    """The saves of a task head (hf/finetune.py's) and of AutoModel hold the encoder alone: AutoModelForMaskedLM
    refuses them in one line (it filled NaN). And a folder whose config promises what its weights lack is refused
    by name, not left to memory as it was."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file
    out, _ = export_model(tmp_path, "crossbert")
    head = transformers.AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True, num_labels=2)
    head.save_pretrained(tmp_path / "tuned")
    transformers.AutoModel.from_pretrained(out, trust_remote_code=True).save_pretrained(tmp_path / "encoder")
    for folder in ("tuned", "encoder"):
        with pytest.raises(ValueError, match="holds the encoder alone.*hf/export.py wrote without --encoder_only"):
            transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / folder, trust_remote_code=True)
    tensors = load_file(out / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.predictor.")}, out / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks \d+ weights CrossBERTForMaskedLM needs \(model\.predictor"):
        transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True)


def test_hidden_states_are_encode_layers_and_transformers_conventions(tmp_path):
    """output_hidden_states: encode()'s layers (the embeddings, then each block), in every class; return_dict=False:
    the tuple; get_input_embeddings: the token embedding; SDPA the attention; attention weights refused in one line."""
    transformers = pytest.importorskip("transformers")
    out, model = export_model(tmp_path, "electra")
    ids = torch.tensor([[464, 3290, 318, 922, 13], [464, MASK, 318, 50256, 50256]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        want = model.model.encode(model.ids(ids), mask, range(model.config.n_layer + 1))
    hf = transformers.AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation="sdpa").eval()
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    head = transformers.AutoModelForTokenClassification.from_pretrained(out, trust_remote_code=True, num_labels=2)
    with torch.no_grad():
        for m in (hf, mlm, head.eval()):
            got = m(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            assert len(got) == len(want) == model.config.n_layer + 1
            assert all(((g - w) * mask[..., None]).abs().max() <= 1e-5 for g, w in zip(got, want))
        last, pooled = hf(input_ids=ids, attention_mask=mask, return_dict=False)
        assert torch.equal(last, hf(input_ids=ids, attention_mask=mask).last_hidden_state) and pooled.shape == (2, 32)
    assert hf.config._attn_implementation == "sdpa" and hf.get_input_embeddings() is hf.model.wte
    assert head.get_input_embeddings() is head.crossbert.model.wte and mlm.get_input_embeddings() is mlm.model.wte
    with pytest.raises(ValueError, match="returns no attention weights"):
        hf(input_ids=ids, output_attentions=True)


@pytest.mark.parametrize("vocab_size", [512, 0])
def test_added_tokens_get_rows_of_their_own(vocab_size, tmp_path):
    """tokenizer.add_tokens, then resize_token_embeddings(len(tokenizer)), with a compact vocabulary and GPT-2's: each
    added token reads and fills a new row (the mean of the rows), the other ids' fills do not change, continued
    pretraining teaches the new rows, and the model saves and loads as resized. Shrinking is refused in one line."""
    transformers = pytest.importorskip("transformers")
    out, _ = exported(tmp_path, "crossbert", vocab_size)
    tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    batch = tok(["Once upon a <mask> there was a cat.", "The <mask> was calm."], padding=True, return_tensors="pt")
    with torch.no_grad():
        before, mean = mlm(**batch).logits, mlm.get_input_embeddings().weight.mean(0)
    assert tok.add_tokens(["zorblat", "quxine"]) == 2
    new = torch.tensor(tok.convert_tokens_to_ids(["zorblat", "quxine"]))
    wte = mlm.resize_token_embeddings(len(tok))
    rows = mlm.vocab_map[new]
    assert wte is mlm.get_input_embeddings() and len(mlm.vocab_map) == len(tok) == mlm.config.vocab_size
    assert rows.unique().numel() == 2 and not torch.isin(rows, mlm.vocab_map[:len(tok) - 2]).any()
    assert torch.allclose(wte.weight[rows], mean.expand(2, -1))
    cfg = mlm.model.config  # a compact vocabulary's <mask> and <pad> are still its last two rows
    assert mlm.vocab_map[MASK] == cfg.mask_token_id and (not vocab_size or mlm.vocab_map[PAD] == cfg.vocab_size - 1)
    with torch.no_grad():
        after = mlm(**batch).logits
    at = batch.input_ids == MASK
    assert torch.allclose(after[..., :MASK + 3][at], before[..., :MASK + 3][at], atol=1e-5)
    assert after[..., new][at].isfinite().all()
    assert torch.isin(new, torch.tensor(tok("a zorblat and a quxine").input_ids)).all()
    # two texts of ids with rows of their own (a compact vocabulary's <unk> would make them alike), one added token each
    row = mlm.vocab_map[:MASK]
    own = (torch.bincount(row)[row] == 1).nonzero()[:, 0]
    text = own[torch.randint(0, len(own), (2, 12), generator=torch.Generator().manual_seed(0))]
    text[0, 5], text[1, 9] = new
    real, added = torch.ones_like(text).index_fill(1, torch.tensor([11]), 0), torch.isin(text, new)
    optimizer = torch.optim.Adam(mlm.parameters(), lr=1e-2)
    for _ in range(20):  # continued pretraining on the two texts: the added tokens become their fills
        optimizer.zero_grad()
        mlm(input_ids=text.masked_fill(added, MASK), attention_mask=real,
            labels=text.masked_fill(~added, -100)).loss.backward()
        optimizer.step()
    mlm.eval().save_pretrained(tmp_path / "resized")
    again = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "resized", trust_remote_code=True).eval()
    encoder = transformers.AutoModel.from_pretrained(tmp_path / "resized", trust_remote_code=True).eval()
    with torch.no_grad():
        fills = mlm(input_ids=text.masked_fill(added, MASK), attention_mask=real).logits
        assert torch.equal(fills[added].argmax(-1), text[added])
        assert torch.equal(again(input_ids=text.masked_fill(added, MASK), attention_mask=real).logits, fills)
        assert torch.equal(encoder(input_ids=text, attention_mask=real).last_hidden_state,
                           mlm.model.encode(mlm.vocab_map[text], real))
    with pytest.raises(ValueError, match=r"resize_token_embeddings\(100\).*not below"):
        mlm.resize_token_embeddings(100)


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_activation_checkpointing_keeps_the_gradients_and_saves_less(model_type, tmp_path):
    """gradient_checkpointing_enable (the Trainer's gradient_checkpointing=True): every block of every stack (the
    encoder, CrossBERT's predictor, ELECTRA's generator) recomputes in the backward pass, so the forward keeps under
    half the activations, and the loss and gradients are the same; disabled, the forward keeps them all again."""
    transformers = pytest.importorskip("transformers")
    out, model = export_model(tmp_path, model_type)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).train()
    g = torch.Generator().manual_seed(0)
    kept = (model.vocab_map < model.config.vocab_size - 3).nonzero()[:, 0]
    ids = kept[torch.randint(0, len(kept), (2, model.config.block_size), generator=g)]
    at = torch.rand(ids.shape, generator=g) < 0.5
    labels = ids.masked_fill(~at, -100)

    def step():
        """The loss, its gradients, and the elements the forward kept for the backward."""
        mlm.zero_grad()
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
            torch.manual_seed(1)  # ELECTRA's samples
            loss = mlm(input_ids=ids.masked_fill(at, MASK), labels=labels).loss
        loss.backward()
        return loss.item(), [p.grad.clone() for p in mlm.parameters()], sum(kept)

    loss, grads, saved = step()
    mlm.activation_checkpointing_enable()
    assert mlm.is_activation_checkpointing
    loss2, grads2, saved2 = step()
    assert saved2 < saved / 2 and abs(loss2 - loss) <= 1e-6
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, grads2))
    mlm.activation_checkpointing_disable()
    assert not mlm.is_activation_checkpointing and step()[2] == saved
