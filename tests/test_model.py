import math
from dataclasses import asdict

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from flops import param_counts, training_flops
from masking import make_views, replace_tokens
from model import MODELS, ModelConfig

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)


def tiny(model_type, **kw):
    torch.manual_seed(0)
    return MODELS[model_type](ModelConfig(model_type=model_type, **{**TINY, **kw})).eval()


def model_args(model, idx, seed=0):
    """idx and the model's random inputs (views; ELECTRA's sampling uniforms too), seeded."""
    return idx, *model.draw(*idx.shape, generator=torch.Generator().manual_seed(seed))


def views_for(model, B, seed=0):
    c = model.config
    return make_views(B, c.block_size, c.mask_ratio, c.cms, generator=torch.Generator().manual_seed(seed))


def test_defaults_follow_the_paper():
    assert (tiny("bert").config.mask_ratio, tiny("bert").config.cms) == (0.2, False)
    c = tiny("crossbert", n_layer=8).config
    assert (c.mask_ratio, c.cms, c.pred_layer) == (0.5, True, 2)
    assert tiny("crossbert", n_layer=2).config.pred_layer == 1
    c = tiny("electra", n_layer=3).config
    assert (c.mask_ratio, c.cms, c.gen_layer, c.rtd_weight) == (0.15, False, 3, 50.0)
    # the generator's width rounds to whole heads of the discriminator's head size, at least one
    assert c.gen_config.n_embd == 16  # a quarter of 2 heads of 16 is half a head: one head
    assert [ModelConfig(model_type="electra", n_embd=768, n_head=12, gen_width=w).gen_config.n_embd
            for w in (0.25, 1 / 3)] == [192, 256]
    with pytest.raises(ValueError, match="random_replace"):
        tiny("electra", random_replace=True)  # 80/10/10 would leave some originals for the generator to see


def test_config_round_trips_and_names_its_model():
    config = tiny("bert").config
    assert ModelConfig(**asdict(config)) == config  # how checkpoints store and rebuild it
    with pytest.raises(AssertionError, match="model_type='bert'"):
        MODELS["bert"](ModelConfig(**TINY))  # a CrossBERT config


@pytest.mark.parametrize("model_type,cms", [("crossbert", False), ("crossbert", True), ("bert", False)])
def test_prediction_never_sees_its_targets(model_type, cms):
    model = tiny(model_type, cms=cms)
    idx = torch.randint(0, 50257, (2, 32))
    views = views_for(model, 2)
    predict = lambda x: model.predict(x[views.rows], views)  # the states the LM head reads at each view's targets
    logits = predict(idx)
    # change every token that view 0 must predict (view 0 is made from row 0)
    changed = idx.clone()
    changed[0, views.target_pos[0]] = (changed[0, views.target_pos[0]] + 1) % 50257
    logits_changed = predict(changed)
    assert torch.allclose(logits_changed[0], logits[0], atol=1e-6)
    # control: changing one visible token does change that view's predictions
    control = idx.clone()
    control[0, views.visible_pos[0, 0]] = (control[0, views.visible_pos[0, 0]] + 1) % 50257
    assert not torch.allclose(predict(control)[0], logits[0], atol=1e-4)
    if cms:  # the complementary view sees what view 0 predicts, so its predictions move
        assert not torch.allclose(logits_changed[1], logits[1], atol=1e-4)


def test_bert_with_80_10_10_can_see_some_targets():
    model = tiny("bert", random_replace=True)
    idx = torch.randint(0, 50257, (8, 32))
    views, u, noise = model.draw(8, 32, generator=torch.Generator().manual_seed(1))
    changed = idx.scatter(1, views.target_pos, (idx.gather(1, views.target_pos) + 1) % 50257)
    a = model.predict(idx, views, u, noise)  # one view per row: the rows are the views
    b = model.predict(changed, views, u, noise)
    assert not torch.equal(a, b)  # the 10% of targets left as they are leak, as in BERT
    # the draws alone decide the corruption: the same draws, the same loss, whatever the global generator does
    torch.manual_seed(0)
    first = model(idx, views, u, noise)[0]
    torch.manual_seed(1)
    assert torch.equal(model(idx, views, u, noise)[0], first)


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_encode_is_padding_invariant(model_type):
    model = tiny(model_type)
    lengths = [32, 20, 7]
    seqs = [torch.randint(0, 50257, (n,)) for n in lengths]
    batch = torch.full((3, 32), 50258)
    mask = torch.zeros(3, 32, dtype=torch.long)
    for i, s in enumerate(seqs):
        batch[i, : len(s)], mask[i, : len(s)] = s, 1
    h = model.encode(batch, mask)
    assert h.shape == (3, 32, 32)
    for i, s in enumerate(seqs):
        alone = model.encode(s[None])[0]
        assert torch.allclose(h[i, : len(s)], alone, atol=1e-5)
    # the padded batch is not trivially equal to an unmasked one
    assert not torch.allclose(model.encode(batch)[1, :20], h[1, :20], atol=1e-3)


def test_encode_layers():
    model = tiny("crossbert", n_layer=3)
    idx = torch.randint(0, 50257, (2, 16))
    hs = model.encode(idx, layers=[1, 2, 3])
    assert len(hs) == 3 and torch.equal(hs[-1], model.encode(idx))
    assert torch.equal(model.encode(idx, layers=[2])[0], hs[1]) and not torch.allclose(hs[0], hs[1])
    # layer 0: the token embeddings under the final norm, before any context
    h0, h3 = model.encode(idx, layers=[0, 3])
    assert torch.allclose(h0, model.ln_f(model.ln_e(model.wte(idx))), atol=1e-6) and torch.equal(h3, hs[-1])
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="layers"):
            model.encode(idx, layers=[bad])
    with pytest.raises(ValueError, match="block_size"):
        model.encode(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_param_counts_match(model_type):
    model = tiny(model_type, n_layer=4)
    total, body = param_counts(model.config, model_type)
    assert total == model.num_params() and body == model.num_params(non_embedding=True)


@pytest.mark.parametrize("model_type,mask_ratio,cms", [("bert", 0.2, False), ("bert", 0.5, True),
                                                        ("crossbert", 0.5, False), ("crossbert", 0.5, True),
                                                        ("crossbert", 0.75, True), ("electra", 0.15, False),
                                                        ("electra", 0.5, True)])
@pytest.mark.parametrize("shape", [dict(n_layer=2, n_head=2, n_embd=64, block_size=64),
                                   dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=512)])
def test_analytic_flops_match_flop_counter(model_type, mask_ratio, cms, shape):
    torch.manual_seed(0)
    # ELECTRA: a generator one head wide and one block deep, so its own terms differ from the discriminator's
    extra = dict(gen_width=0.5, gen_layer=1) if model_type == "electra" else {}
    model = MODELS[model_type](ModelConfig(model_type=model_type, **shape, mask_ratio=mask_ratio, cms=cms, **extra))
    B = 2
    idx = torch.randint(0, 500, (B, shape["block_size"]))
    # the math backend runs attention as matmuls, which the counter sees (the CPU flash kernel it does not)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx)[0].backward()
    measured = counter.get_total_flops()
    assert measured == training_flops(model.config, model_type, B)  # exact: both count the same matmuls


OLD_BLOCK = dict(mlp="gelu", emb_norm=False, lm_head=False, decoder_bias=False)  # the block before the ablation


def test_geglu_has_a_gelu_mlps_parameters_and_gates_its_value():
    from model import MLP
    for C in (128, 256, 384, 512, 768, 1024):
        hidden = ModelConfig(n_embd=C, n_head=4).mlp_hidden
        assert hidden % 32 == 0 and abs(3 * hidden - 2 * 4 * C) <= 48  # 3 matrices of 8/3 C: a 4 x GELU MLP's 2 of 4 C
    assert ModelConfig(n_embd=768, n_head=12).mlp_hidden == 2048
    torch.manual_seed(0)
    mlp = MLP(ModelConfig(n_embd=64, n_head=2))
    x = torch.randn(3, 5, 64)
    value, gate = x @ mlp.fc.weight[:mlp.proj.in_features].T, x @ mlp.fc.weight[mlp.proj.in_features:].T
    assert torch.allclose(mlp(x), (value * torch.nn.functional.gelu(gate)) @ mlp.proj.weight.T, atol=1e-6)


def test_init_statistics():
    torch.manual_seed(0)
    model = MODELS["bert"](ModelConfig(model_type="bert", n_layer=8, n_head=8, n_embd=512, vocab_size=4096))
    p = dict(model.named_parameters())
    for name, std in [("wte.weight", 0.02), ("blocks.0.attn.q.weight", 0.02), ("blocks.3.mlp.fc.weight", 0.02),
                      ("head.dense.weight", 0.02), ("blocks.0.attn.proj.weight", 0.02 / 4),  # 1 / sqrt(2 x 8 layers)
                      ("blocks.7.mlp.proj.weight", 0.02 / 4)]:
        assert p[name].std().item() == pytest.approx(std, rel=0.03) and abs(p[name].mean().item()) < std / 20, name
    assert torch.equal(p["decoder_bias"], torch.zeros(4096))
    assert all(torch.equal(v, torch.ones_like(v)) for n, v in p.items() if ".ln" in n or n.startswith("ln"))


def test_lm_head_is_tied_to_the_embeddings_and_normalises_its_input():
    model = tiny("bert", vocab_size=512)
    # one (vocab, C) matrix in the whole model: the decoder is the embedding table
    assert [n for n, v in model.named_parameters() if v.shape == (512, 32)] == ["wte.weight"]
    h = torch.randn(2, 5, 32)
    idx = torch.randint(0, 500, (2, 32))
    target = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        model.decoder_bias.normal_()
        logits, _ = model.lm_loss(h, idx, target)
        head = model.head.ln(torch.nn.functional.gelu(h @ model.head.dense.weight.T))
        assert torch.allclose(logits, head @ model.wte.weight.T + model.decoder_bias, atol=1e-5)
        assert torch.allclose(head.std(-1, unbiased=False), torch.ones(2, 5), atol=0.01)  # the head's norm (eps)
        model.wte.weight.mul_(2)  # the decoder follows the embeddings
        assert torch.allclose(model.lm_loss(h, idx, target)[0], head @ model.wte.weight.T + model.decoder_bias,
                              atol=1e-5)
    # the embedding norm: each token's embedding at zero mean and unit variance, whatever the table's scale
    e = model.ln_e(model.wte(idx))
    assert torch.allclose(e.mean(-1), torch.zeros(2, 32), atol=1e-5) and torch.allclose(e.std(-1, unbiased=False),
                                                                                         torch.ones(2, 32), atol=0.01)


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_overfits_one_batch(model_type):
    torch.manual_seed(0)
    model = MODELS[model_type](ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=64, block_size=32,
                                           vocab_size=256))
    idx = torch.randint(0, 250, (2, 32))
    args = model_args(model, idx)
    opt = model.configure_optimizers(0.0, 2e-3, (0.9, 0.95), "cpu")
    model.train()
    for _ in range(200):
        loss, stats = model(*args)
        opt.zero_grad()
        loss.backward()
        opt.step()
    mlm_loss = stats.get("mlm_loss", loss)  # ELECTRA: its generator's masked-token loss, a part of its loss
    assert mlm_loss.item() < 0.1 * math.log(256)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_compiled_matches_eager(model_type):
    model = tiny(model_type)
    idx = torch.randint(0, 50257, (4, 32))
    args = model_args(model, idx)
    eager, _ = model(*args)
    compiled, _ = torch.compile(model)(*args)
    assert compiled.item() == pytest.approx(eager.item(), abs=1e-4)


# ----------------------------------------------------------------------------
# ELECTRA: what the generator sees, what the discriminator is told, where the gradients go

def test_generator_never_sees_the_original_at_masked_positions():
    model = tiny("electra")
    idx = torch.randint(0, 50257, (2, 32))
    views = views_for(model, 2)
    logits, _ = model.run_generator(idx, views.target_pos)
    changed = idx.scatter(1, views.target_pos, (idx.gather(1, views.target_pos) + 1) % 50257)
    assert torch.equal(model.run_generator(changed, views.target_pos)[0], logits)
    # control: a token it is shown does move its predictions
    control = idx.clone()
    control[0, views.visible_pos[0, 0]] += 1
    assert not torch.allclose(model.run_generator(control, views.target_pos)[0][0], logits[0], atol=1e-4)


def test_rtd_label_is_replaced_token_differs_from_original(monkeypatch):
    model = tiny("electra", vocab_size=64)  # <mask> is 62, <pad> 63
    idx = torch.randint(0, 60, (4, 32))
    views = views_for(model, 4)
    target = idx.gather(1, views.target_pos)
    # a generator sure of the original at even target slots, of another token at odd ones
    keep = torch.arange(target.size(1)) % 2 == 0
    choice = torch.where(keep, target, (target + 1) % 60)
    logits = torch.full((*target.shape, 64), -1e4).scatter(-1, choice[..., None], 1e4)
    replaced, labels = replace_tokens(idx, views.target_pos, logits, torch.rand(target.shape))
    assert torch.equal(replaced.gather(1, views.target_pos), choice)  # each slot got the generator's sample
    expected = torch.zeros_like(idx, dtype=torch.bool).scatter(1, views.target_pos[:, ~keep], True)
    assert torch.equal(labels, expected)  # a sample equal to the original counts as original
    # and forward trains the discriminator on exactly these labels
    monkeypatch.setattr(model, "run_generator", lambda i, pos: (logits, logits.sum() * 0))
    seen = []
    model.rtd_head.register_forward_hook(lambda m, args, out: seen.append(out.squeeze(-1)))
    _, stats = model(idx, views, torch.rand(target.shape))
    bce = torch.nn.functional.binary_cross_entropy_with_logits(seen[0], expected.float())
    assert stats["rtd_loss"].item() == pytest.approx(bce.item(), abs=1e-6)
    assert stats["replaced"].item() == pytest.approx(expected.float().mean().item())  # the share of positions replaced


def test_generator_samples_text_ids_only(monkeypatch):
    model = tiny("electra", vocab_size=64)
    idx = torch.randint(0, 60, (4, 32))
    views = views_for(model, 4)
    # a generator all but sure of <mask> (62) and <pad> (63), with a little mass on text ids
    logits = torch.zeros(*views.target_pos.shape, 64)
    logits[..., 62:] = 30.0
    monkeypatch.setattr(model, "run_generator", lambda i, pos: (logits, logits.sum() * 0))
    seen = []  # with the generator patched out, the embedding is read by the discriminator alone
    model.wte.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    _, stats = model(idx, views, torch.rand(views.target_pos.shape))
    assert seen[0].max() < 62 and stats["replaced"] > 0.1  # replaced, and only by text ids


def test_samples_follow_the_generator_distribution():
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    logits = p.log().expand(1, 40_000, 5)
    idx = torch.full((1, 40_000), 9)  # no sample equals it, so every label is "replaced"
    replaced, labels = replace_tokens(idx, torch.arange(40_000)[None], logits, torch.rand(1, 40_000))
    freq = torch.bincount(replaced[0], minlength=5).float() / 40_000
    assert torch.allclose(freq, p, atol=0.01) and labels.all()  # zero-probability tokens are never drawn


def test_no_rtd_gradient_reaches_the_generator():
    idx = torch.randint(0, 50257, (2, 32))
    grads = {}
    for weight in (50.0, 0.0):  # the same model, data and samples; only the RTD term's weight differs
        model = tiny("electra", rtd_weight=weight)
        args = model_args(model, idx)
        model(*args)[0].backward()
        grads[weight] = {n: p.grad.clone() for n, p in model.named_parameters()}
    generator = [n for n in grads[0.0] if n.startswith(("gen_in", "generator.", "ln_g", "gen_out"))]
    assert len(generator) > 4 and all(torch.equal(grads[50.0][n], grads[0.0][n]) for n in generator)
    # control: the RTD term does reach the discriminator, and the token embeddings the two share
    assert not torch.equal(grads[50.0]["blocks.0.attn.q.weight"], grads[0.0]["blocks.0.attn.q.weight"])
    assert not torch.equal(grads[50.0]["wte.weight"], grads[0.0]["wte.weight"])


def test_flops_cli_counts_each_model_with_its_own_defaults(capsys):
    import flops
    flops.main(["--n_layer=3", "--n_head=4", "--n_embd=64", "--block_size=32", "--vocab_size=512"])
    rows = {line[:28].strip(): line[28:].split() for line in capsys.readouterr().out.splitlines()}
    for i, model_type in enumerate(("bert", "crossbert", "electra")):
        cfg = ModelConfig(model_type=model_type, n_layer=3, n_head=4, n_embd=64, block_size=32, vocab_size=512)
        assert float(rows["params (M)"][i]) == round(param_counts(cfg, model_type)[0] / 1e6, 2)
    # ELECTRA's generator gets the discriminator's depth and a quarter of its width (one head of 16)
    assert rows["generator width x depth"][2:] == ["16", "x", "3"]


@pytest.mark.parametrize("model_type", ["bert", "crossbert", "electra"])
def test_one_forward_contract(model_type):
    # every model: forward(idx, *draw()) -> (scalar loss, {name: detached scalar}); the draws are seeded
    model = tiny(model_type)
    idx = torch.randint(0, 50257, (3, 32))
    a, b = model_args(model, idx, seed=1), model_args(model, idx, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)))
    loss, stats = model(*a)
    assert loss.dim() == 0 and loss.requires_grad
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
    assert set(stats) == ({"mlm_loss", "rtd_loss", "rtd_accuracy", "replaced"} if model_type == "electra" else set())
    if model_type == "electra":  # the loss is the sum its parts say
        assert loss.item() == pytest.approx(stats["mlm_loss"].item() + 50 * stats["rtd_loss"].item(), rel=1e-5)
    torch.manual_seed(0)
    fresh, _ = model(idx)  # without draws, forward draws its own
    assert torch.isfinite(fresh)


def test_model_config_refuses_shapes_no_model_can_have():
    from configurator import make_config
    for bad, message in [(dict(n_embd=64, n_head=3), "must split into n_head=3 heads"),
                         (dict(n_embd=30, n_head=2), "heads of an even size"), (dict(n_layer=0), "n_layer=0"),
                         (dict(pred_layer=0), "pred_layer=0"), (dict(gen_width=1.5), "gen_width=1.5"),
                         (dict(mask_ratio=1.0), "mask_ratio=1.0"), (dict(vocab_size=2), "vocab_size=2"),
                         (dict(block_size=33), "CMS")]:
        with pytest.raises(ValueError, match=message):
            make_config({"model_type": "crossbert", **TINY, **bad})
    # a script's settings: other keys are ignored, and vocab_size 0 is GPT-2's full vocabulary
    c = make_config({"model_type": "bert", "n_layer": 3, "vocab_size": 0, "learning_rate": 1e-3, "out_dir": "x"})
    assert c.n_layer == 3 and c.vocab_size == 50304 and c.mask_ratio == 0.2


def test_checkpoints_of_an_earlier_block_are_refused_and_older_ones_load(tmp_path):
    from configurator import UserError
    from plumbing.checkpoint import load_checkpoint, save_checkpoint
    model = tiny("bert", vocab_size=64)
    vocab_map = torch.randint(0, 64, (50304,))
    switches = dict(mlp="geglu", emb_norm=True, lm_head=True, decoder_bias=True)
    # a checkpoint of today's block from before the switches went: they, token_ids and the map among the weights
    old = dict(asdict(model.config), **switches, token_ids=50304, rope_base=10000.0, mask_token_id=62)
    save_checkpoint(tmp_path / "ckpt.pt", dict(model={**model.state_dict(), "vocab_map": vocab_map}, model_type="bert",
                                               model_args=old))
    loaded, ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded.config == model.config and torch.equal(ckpt["vocab_map"], vocab_map)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())
    for earlier in (dict(old, mlp="gelu"), {k: v for k, v in old.items() if k not in switches}):
        save_checkpoint(tmp_path / "old.pt", dict(model=model.state_dict(), model_type="bert", model_args=earlier))
        with pytest.raises(UserError, match="an earlier block.*commit 5bd5a8c"):
            load_checkpoint(tmp_path / "old.pt")
