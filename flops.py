"""
Analytic parameter and FLOP counts of BERT, CrossBERT and ELECTRA, from a ModelConfig alone: its mask_ratio and cms
decide the views, pred_layer the predictor, gen_width and gen_layer ELECTRA's generator. Counted: matrix multiplies,
2 FLOPs a multiply-add, as torch.utils.flop_counter counts them (a test); a training step is 3x its forward pass.

    python flops.py --n_layer=12 --n_head=12 --n_embd=768 --block_size=512            # the three side by side
    python flops.py --n_layer=12 --n_head=12 --n_embd=768 --block_size=512 --design   # BERT and CrossBERT across the
                                                                                      # paper's mask ratios, CMS on/off
"""
import sys
from dataclasses import replace


def mlp_params(config):
    """The MLP's weights: fc (a value and a gate) and proj."""
    return 3 * config.n_embd * config.mlp_hidden


def self_block_flops(config, S):
    """Forward FLOPs of one self-attention block over S tokens, of the config's width and MLP."""
    C = config.n_embd
    # q 2SC^2, kv 4SC^2, proj 2SC^2, the MLP 2 x its weights per token; QK^T and AV 2S^2C each
    return 8 * S * C * C + 2 * S * mlp_params(config) + 4 * S * S * C


def cross_block_flops(config, Q, S):
    """Forward FLOPs of one cross-attention block: Q queries over S keys."""
    C = config.n_embd
    # q and proj on the queries 4QC^2, kv on the keys 4SC^2, the MLP on the queries, attention 4QSC
    return 4 * Q * C * C + 4 * S * C * C + 2 * Q * mlp_params(config) + 4 * Q * S * C


def lm_head_flops(config, M):
    """Forward FLOPs of the LM head at M positions: the prediction head's dense, then the tied decoder."""
    C = config.n_embd
    return 2 * M * C * C + 2 * M * C * config.vocab_size


def forward_flops(config, model_type):
    """Forward FLOPs for one input row (all its views)."""
    C, T, L = config.n_embd, config.block_size, config.n_layer
    V, K, M = config.views
    head = lm_head_flops(config, M)  # at the target positions only
    if model_type == "bert":
        per_view = L * self_block_flops(config, T) + head
    elif model_type == "crossbert":
        per_view = L * self_block_flops(config, K) + config.pred_layer * cross_block_flops(config, M, K) + head
    else:  # ELECTRA: the generator (projections in at T positions and out at M, its blocks, the LM head), then the
        # discriminator over all T positions and its one-logit RTD head
        G = config.gen_config.n_embd
        generator = 2 * T * C * G + config.gen_layer * self_block_flops(config.gen_config, T) + 2 * M * G * C + head
        per_view = generator + L * self_block_flops(config, T) + 2 * T * C
    return V * per_view


def training_flops(config, model_type, batch_size=1):
    """FLOPs of one training step (forward + backward) on batch_size input rows."""
    return 3 * batch_size * forward_flops(config, model_type)


def budget_steps(max_flops, flops_per_step):
    """The steps a training-FLOP budget buys: the most that fit in it (at least one)."""
    return max(1, int(max_flops // flops_per_step))


def flops_per_position(config, model_type):
    """Training FLOPs per sequence position covered (rows x views x block_size): what tokens/s counts."""
    V, _, _ = config.views
    return training_flops(config, model_type) / (V * config.block_size)


def head_share(config, model_type):
    """The share of a training step's FLOPs spent in the LM head: the prediction head and the tied decoder, at every
    view's targets (CrossBERT with CMS: every position, once per row; BERT: its masked share; ELECTRA: its generator's
    head). Forward and backward both cost 3x their forward pass, so the forward split is the step's."""
    V, _, M = config.views
    return V * lm_head_flops(config, M) / forward_flops(config, model_type)


def inference_flops_per_token(config):
    """Forward FLOPs per token of encode(): the encoder on the full, unmasked sequence."""
    return config.n_layer * self_block_flops(config, config.block_size) / config.block_size


def param_counts(config, model_type):
    """(total, non-embedding) parameters; the decoder is tied to the embedding."""
    C = config.n_embd
    block = lambda cfg: 4 * cfg.n_embd ** 2 + mlp_params(cfg) + 2 * cfg.n_embd  # attention, MLP, two bias-free norms
    body = config.n_layer * block(config) + C  # + final norm
    body += C + (C * C + C) + config.vocab_size  # the embeddings' norm, the prediction head, the decoder's bias
    if model_type == "crossbert":
        body += config.pred_layer * block(config) + C + C  # predictor, its norm, the mask query
    if model_type == "electra":
        G = config.gen_config.n_embd
        body += 2 * C * G + config.gen_layer * block(config.gen_config) + G  # projections, generator blocks, its norm
        body += C + 1  # the RTD head
    return body + config.vocab_size * C, body


DESIGN_RATIOS = (0.5, 2 / 3, 0.75)  # the paper's mask ratios: CMS's 1 - 1/V for 2, 3 and 4 views


def cms_block(block_size, mask_ratio):
    """The longest block up to block_size that complementary masking at mask_ratio can split: its 1 / (1 - mask_ratio)
    views need a block they divide (128 -> 126 for the three views of 0.667)."""
    return block_size - block_size % round(1 / (1 - mask_ratio))


def design(config):
    """The paper's throughput claim, counted: CrossBERT's encoder runs on the visible tokens only, so a higher mask
    ratio leaves it less work per token. For the shape of `config` (depth, width, block, vocabulary), one row per
    model: BERT at its default ratio (the reference), BERT at each of DESIGN_RATIOS (one view: with CMS it would encode
    the whole row once per view), CrossBERT at each with CMS and without. A row: its config, training FLOPs per input
    token, and the input tokens/s and view positions/s (the paper's tokens/s) it would reach at the reference BERT's
    FLOP/s, as multiples of that BERT's, and the LM head's share of its step. CMS with V views needs a block that V
    divides: such a row is counted at the largest block below that does, against BERT at that block."""
    rows = []
    models = [("bert", None, False)] + [("bert", m, False) for m in DESIGN_RATIOS]
    models += [("crossbert", m, cms) for m in DESIGN_RATIOS for cms in (True, False)]
    for model_type, mask_ratio, cms in models:
        T = cms_block(config.block_size, mask_ratio) if cms else config.block_size
        cfg = replace(config, model_type=model_type, mask_ratio=mask_ratio, cms=cms, block_size=T)
        bert = training_flops(replace(cfg, model_type="bert", mask_ratio=None, cms=False), "bert") / T
        per_token = training_flops(cfg, model_type) / T
        rows.append(dict(config=cfg, flops_per_token=per_token, input_tokens_vs_bert=bert / per_token,
                         view_positions_vs_bert=bert / flops_per_position(cfg, model_type),
                         head_share=head_share(cfg, model_type)))
    return rows


def print_design(config):
    """design(config) as a markdown table."""
    print(f"{config.n_layer} x {config.n_embd}, block {config.block_size}, vocabulary {config.vocab_size}; multiples "
          "of the reference BERT's at equal FLOP/s\n")
    print("| model | mask ratio | CMS | block | views x (encoder tokens / predicted) | train MFLOPs per input token | "
          "input tokens/s | view positions/s | LM head's share |\n" + "|---" * 9 + "|")
    for r in design(config):
        cfg = r["config"]
        V, K, M = cfg.views
        encoder = K if cfg.model_type == "crossbert" else cfg.block_size
        print(f"| {cfg.model_type} | {cfg.mask_ratio:.3g} | {'on' if cfg.cms else 'off'} | {cfg.block_size} | "
              f"{V} x ({encoder} / {M}) | {r['flops_per_token'] / 1e6:.2f} | {r['input_tokens_vs_bert']:.2f}x | "
              f"{r['view_positions_vs_bert']:.2f}x | {100 * r['head_share']:.1f}% |")


def main(argv):
    from dataclasses import asdict

    import model  # the settings are ModelConfig's, and its file holds their comments
    from configurator import UserError, configure
    # the fields whose default depends on the model stay None, so each model below gets its own
    defaults = dict(asdict(model.ModelConfig()), mask_ratio=None, cms=None, pred_layer=None, gen_layer=None,
                    design=False)  # design()'s table for this shape instead: BERT and CrossBERT across ratios and CMS
    del defaults["model_type"]
    kwargs = configure(defaults, argv, help_from=[__file__, model.__file__])  # the settings' comments: ModelConfig's
    if kwargs.pop("design"):
        if kwargs["mask_ratio"] is not None or kwargs["cms"] is not None:
            raise UserError("--design varies mask_ratio and cms itself; give it the shape alone")
        try:
            config = model.ModelConfig(model_type="bert", **kwargs)
        except ValueError as e:  # a shape no model can have
            raise UserError(str(e)) from None
        print_design(config)
        return
    rows = {}
    names = {"bert": "BERT", "crossbert": "CrossBERT", "electra": "ELECTRA"}
    for model_type in names:
        try:
            cfg = model.ModelConfig(model_type=model_type, **kwargs)
        except ValueError as e:  # e.g. a mask ratio the views cannot realise
            raise UserError(f"{names[model_type]}: {e}") from None
        total, body = param_counts(cfg, model_type)
        V, K, M = cfg.views
        rows[model_type] = {
            "mask ratio / views": f"{cfg.mask_ratio} / {V}",
            "encoder tokens per view": K if model_type == "crossbert" else cfg.block_size,
            "predicted per view": M,
            "generator width x depth": f"{cfg.gen_config.n_embd} x {cfg.gen_layer}" if model_type == "electra" else "-",
            "params (M)": f"{total / 1e6:.2f}",
            "non-embedding params (M)": f"{body / 1e6:.2f}",
            "train GFLOPs per row": f"{training_flops(cfg, model_type) / 1e9:.3f}",
            "train MFLOPs per position": f"{flops_per_position(cfg, model_type) / 1e6:.2f}",
            "inference MFLOPs per token": f"{inference_flops_per_token(cfg) / 1e6:.2f}",
            "_fpp": flops_per_position(cfg, model_type),
        }
    print(f"{'':28s}" + "".join(f"{name:>14s}" for name in names.values()))
    for key in rows["bert"]:
        if not key.startswith("_"):
            print(f"{key:28s}" + "".join(f"{rows[m][key]!s:>14s}" for m in names))
    print(f"training FLOPs per position, BERT / CrossBERT: {rows['bert']['_fpp'] / rows['crossbert']['_fpp']:.2f}x, "
          f"ELECTRA / BERT: {rows['electra']['_fpp'] / rows['bert']['_fpp']:.2f}x")


if __name__ == "__main__":
    from configurator import user_errors
    with user_errors("flops.py"):
        main(sys.argv[1:])
