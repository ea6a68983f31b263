"""
BERT, CrossBERT and ELECTRA in one file.

BERT: replace the masked tokens by <mask>, run every layer over the whole
sequence, predict the masked tokens from the last layer.

CrossBERT ("Separating Representation from Reconstruction Enables Scalable Text
Encoders"): a deep encoder sees only the visible tokens (masked tokens are
dropped, as in MAE), and a shallow predictor of cross-attention-only blocks
reconstructs the masked tokens from the encoder's states. The encoder never
does reconstruction, so its last layer stays a good representation. With
complementary masking (CMS) every sequence becomes views that predict each
other's tokens, so every token gets a gradient.

ELECTRA ("Pre-training Text Encoders as Discriminators Rather Than Generators"), the paper's
other baseline: a small generator fills BERT's masked positions with plausible tokens, and a
full-size discriminator, which sees every position, learns which tokens were replaced. It also
trains on every token, but on a flat encoder; the discriminator is the encoder that is kept.

    import torch
    from model import ModelConfig, CrossBERT
    model = CrossBERT(ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=128))
    # BERT(ModelConfig(model_type="bert", ...)) and ELECTRA(ModelConfig(model_type="electra", ...)) alike;
    # model_type also picks the masking defaults
    idx = torch.randint(0, 50257, (8, 128))                  # token ids
    loss, stats = model(idx)                                 # pretraining; stats: detached scalars to log
    loss.backward()
    with torch.no_grad():
        feats = model.encode(idx).mean(dim=1)                # frozen features (8, 256)

All three are built of one pre-norm block (attention with rotary positions, a GeGLU MLP) and share the LM head (a
prediction head, then the decoder tied to the token embeddings, with a bias); docs/block.md measures each part.

Every model's forward is forward(idx, *draws) -> (loss, stats): draws are draw()'s random inputs (the views, and
ELECTRA's sampling uniforms), drawn inside when not given; stats are the detached parts of a composite loss
(ELECTRA's: mlm_loss, its generator's masked-token loss, and the RTD terms), empty for BERT and CrossBERT. BERT and
CrossBERT differ only in predict(), the states at the targets.

Names: idx holds token ids, x, h and q hidden states, *_pos positions in the sequence. Shapes: B input
rows, N views (B x views per row), T positions, K visible and M target positions per view, C channels.
Depends on torch and masking.py alone; importing it has no side effects.
"""
import dataclasses
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from masking import corrupt, make_views, view_shape


@dataclass
class ModelConfig:
    model_type: str = "crossbert"   # bert | crossbert | electra; decides the defaults of mask_ratio and cms
    block_size: int = 128
    vocab_size: int = 50304         # GPT-2's 50257 ids + <mask> + <pad>, padded to a multiple of 64
    token_ids: int = 50304          # ids the tokenizer emits; vocab_size < token_ids is a compact vocabulary,
                                    # and the buffer vocab_map turns token ids into its ids
    n_layer: int = 4                # encoder depth
    n_head: int = 4
    n_embd: int = 128
    random_replace: bool = False    # BERT's 80/10/10 corruption instead of all <mask>
    dropout: float = 0.0
    init_std: float = 0.02          # the paper lowered it to stabilise its largest model
    rope_base: float = 10000.0
    # the block, shared by the three models (each part measured against HF ModernBERT trained identically: docs/block.md)
    mlp: str = "geglu"              # geglu: a GELU-gated MLP of hidden width mlp_hidden; gelu: GELU, 4 x n_embd wide
    emb_norm: bool = True           # LayerNorm on the token embeddings
    lm_head: bool = True            # the MLM prediction head (dense, GELU, LayerNorm) before the tied decoder
    decoder_bias: bool = True       # a bias on the tied decoder's logits: the token frequencies live there
    mask_token_id: int | None = None  # <mask>'s row; None: GPT-2's 50257, or vocab_size - 2 in a compact
                                      # vocabulary (the layout of data/tokenizer.compact_vocab)
    mask_ratio: float | None = None # None: the model's default (__post_init__)
    cms: bool | None = None         # complementary views; None: the model's default (__post_init__)
    pred_layer: int | None = None   # CrossBERT's predictor depth; None: max(1, n_layer // 4)
    gen_width: float = 0.25         # ELECTRA's generator width, a fraction of n_embd (see gen_embd)
    gen_layer: int | None = None    # ELECTRA's generator depth; None: n_layer, as in ELECTRA
    rtd_weight: float = 50.0        # ELECTRA's loss: MLM + rtd_weight x replaced-token detection

    def __post_init__(self):
        """The fields checked (check_config, at the end of the file: a shape no model can have is a ValueError that
        names the setting and the fix; train.py, sweep.py, bench.py, flops.py and the evaluators all build their models
        through here), then the paper's defaults for the fields left at None."""
        check_config(self)
        if self.mask_token_id is None:
            self.mask_token_id = 50257 if self.vocab_size >= self.token_ids else self.vocab_size - 2
        if self.mask_ratio is None:
            self.mask_ratio = {"bert": 0.2, "crossbert": 0.5, "electra": 0.15}[self.model_type]
        if self.cms is None:
            self.cms = self.model_type == "crossbert"
        # the other models keep these values unused, so that configs of every model compare alike
        if self.pred_layer is None:
            self.pred_layer = max(1, self.n_layer // 4)
        if self.gen_layer is None:
            self.gen_layer = self.n_layer
        self.views  # raises if the views cannot be cut (masking.view_shape)

    @property
    def views(self):
        """(V, K, M): views per input row, and the visible and predicted positions of each (masking.view_shape)."""
        return view_shape(self.block_size, self.mask_ratio, self.cms)

    @property
    def mlp_hidden(self):
        """The MLP's hidden width: 4 x n_embd for gelu; for geglu 8/3 x n_embd rounded to a multiple of 32 (at least
        32), so its three matrices hold as many parameters, and cost as many FLOPs, as gelu's two (our choice)."""
        return 4 * self.n_embd if self.mlp == "gelu" else max(32, round(8 * self.n_embd / 3 / 32) * 32)

    @property
    def gen_embd(self):
        """ELECTRA's generator width: gen_width x n_embd, rounded to whole heads of the discriminator's head size
        (so both share the RoPE tables), at least one head."""
        return max(1, round(self.gen_width * self.n_head)) * (self.n_embd // self.n_head)

    @property
    def gen_config(self):
        """The config of ELECTRA's generator blocks: a narrow BERT with the discriminator's head size."""
        head_size = self.n_embd // self.n_head
        return replace(self, model_type="bert", n_embd=self.gen_embd, n_head=self.gen_embd // head_size)


def make_config(settings):
    """The ModelConfig of a script's settings: a dict holding some of ModelConfig's fields (and other keys, which
    are ignored), as train.py's globals, sweep.py's runs and bench.py's settings do; vocab_size 0 means GPT-2's full
    vocabulary. Checked: a ValueError names a setting no model can have."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    args = {k: v for k, v in settings.items() if k in fields and not (k == "vocab_size" and not v)}
    return ModelConfig(**args)


# ----------------------------------------------------------------------------
# The three models, and what they share; then the transformer parts they are built of, the poolers that turn the
# encoder's states into one embedding, and last the config's checks

class MaskedLM(nn.Module):
    """What the models share: the token embedding, the encoder stack, the tied LM head,
    encode() for frozen features, and the optimizer."""

    model_type = None  # each model's; its config must say the same

    def __init__(self, config):
        super().__init__()
        if config.model_type != self.model_type:
            raise ValueError(f"{type(self).__name__} takes ModelConfig(model_type={self.model_type!r}), "
                             f"got model_type={config.model_type!r}")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.ln_e = nn.LayerNorm(config.n_embd, bias=False) if config.emb_norm else nn.Identity()
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        # the LM head: (the prediction head, then) the decoder, tied to wte, (with a bias)
        self.head = PredictionHead(config) if config.lm_head else nn.Identity()
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None
        cos, sin = rope_tables(config)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # a compact vocabulary (small models are head-bound): the map is set by the trainer, saved with the weights
        self.register_buffer("vocab_map", torch.zeros(config.token_ids, dtype=torch.long)
                             if config.vocab_size < config.token_ids else None)

    def init_weights(self):
        std = self.config.init_std
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # residual projections shrink with depth so the residual stream's variance stays put
                scale = 1 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj.weight") else 1
                nn.init.normal_(p, mean=0.0, std=std * scale)

    def embed(self, idx):
        """Token embeddings (N, T, C) of embedding ids idx (N, T)."""
        return self.drop(self.ln_e(self.wte(idx)))

    def vocab_ids(self, idx):
        """Token ids as the embedding's row ids (the same, unless the vocabulary is compact)."""
        return idx if self.vocab_map is None else self.vocab_map[idx]

    def rope(self, pos):
        """Angles for positions pos (T,) or (N, T), shaped to broadcast over heads."""
        return self.cos[pos].unsqueeze(-3), self.sin[pos].unsqueeze(-3)

    def run_encoder(self, idx, pos, attn_mask=None, layers=()):
        """The encoder stack on embedding ids idx (N, T) at positions pos: final-normed states (N, T, C), and
        those of `layers` (the final norm applied to each chosen block's output, so all are on one scale; layer 0
        is the token embeddings)."""
        rope = self.rope(pos)
        x = self.embed(idx)
        kept = [self.ln_f(x)] if 0 in layers else []
        for i, block in enumerate(self.blocks, start=1):
            x = block(x, rope, attn_mask=attn_mask)
            if i in layers and i < self.config.n_layer:
                kept.append(self.ln_f(x))
        x = self.ln_f(x)
        return x, kept + [x] * (self.config.n_layer in layers)

    def draw(self, B, T, generator=None, device=None):
        """The random inputs of a training forward pass on B rows of T tokens, which follow idx in forward(): the
        views (where each view sees and predicts; masking.py), and for ELECTRA the uniforms that pick its generator's
        samples. A trainer draws them from its own generator, so they are a function of its seed (see train.py)."""
        return (make_views(B, T, self.config.mask_ratio, self.config.cms, generator=generator, device=device),)

    def forward(self, idx, *draws):
        """Pretraining on token ids idx (B, T): the loss, and a dict of detached scalars to log beside it, the parts of
        a composite loss (ELECTRA's; empty for BERT and CrossBERT, whose loss is the masked-token loss itself).
        draws: draw()'s random inputs; without them, fresh ones are drawn here."""
        views, *rest = draws or self.draw(*idx.shape, device=idx.device)
        return self.objective(self.vocab_ids(idx)[views.rows], views, *rest)  # (N, T): each view's row, in embedding ids

    def objective(self, idx, views):
        """BERT's and CrossBERT's: the tied LM head on predict()'s states, cross-entropy at the targets."""
        _, loss = self.lm_loss(self.predict(idx, views), idx, views.target_pos)
        return loss, {}

    def lm_logits(self, h):
        """The LM head: logits (.., vocab) of the states h (.., C)."""
        return F.linear(self.head(h), self.wte.weight, self.decoder_bias)

    def lm_loss(self, h, idx, target_pos):
        """The LM head on the states h (N, M, C) at target_pos (N, M); cross-entropy against idx's ids there."""
        logits = self.lm_logits(h)
        labels = idx.gather(1, target_pos)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        return logits, loss

    def fill(self, idx, views):
        """Logits (N, M, vocab) of what the model puts at each view's targets, the way it learned to (sample.py):
        the LM head on predict()'s states. idx (N, T): each view's row, in embedding ids; the targets' ids are unread."""
        return self.lm_logits(self.predict(idx, views))

    def encode(self, idx, attention_mask=None, layers=None):
        """Features of the unmasked input: (B, T, C) from the last layer, or a list for `layers`: 1..n_layer are the
        blocks' outputs, and 0 the token embeddings, whose mean over a sentence is a bag of tokens (no context).

        attention_mask (B, T): 1 for real tokens, 0 for padding; padded keys are ignored,
        so a padded sequence gets the same features as the same sequence alone. Gradients
        flow as the caller's grad mode says: wrap in torch.no_grad() for frozen features.
        """
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}; truncate the input")
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        wanted = [self.config.n_layer] if layers is None else list(layers)
        bad = [i for i in wanted if not 0 <= i <= self.config.n_layer]
        if bad:
            raise ValueError(f"layers {bad} out of range; the encoder has layers 0..{self.config.n_layer} "
                             "(0: the embeddings)")
        _, kept = self.run_encoder(self.vocab_ids(idx), torch.arange(T, device=idx.device), mask, set(wanted))
        by_layer = dict(zip(sorted(set(wanted)), kept))
        return by_layer[self.config.n_layer] if layers is None else [by_layer[i] for i in wanted]

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # decay the matrices of linear layers only: not embeddings, norms or the mask query
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and n != "wte.weight"]
        no_decay = [p for n, p in self.named_parameters() if p.dim() < 2 or n == "wte.weight"]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # fused: one kernel for all parameters; on a CPU the default (a loop of small ops per tensor) costs 2-3x more
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))


class BERT(MaskedLM):
    model_type = "bert"

    def __init__(self, config):
        super().__init__(config)
        self.init_weights()

    def draw(self, B, T, generator=None, device=None):
        """The views, and with random_replace BERT's 80/10/10 draws at each target: uniforms u (N, M) that pick
        <mask>, a random id or the token itself, and the random ids (N, M), below <mask> (masking.corrupt)."""
        views, = super().draw(B, T, generator, device)
        if not self.config.random_replace:
            return (views,)
        shape = views.target_pos.shape
        return (views, torch.rand(shape, generator=generator, device=device),
                torch.randint(0, self.config.mask_token_id, shape, generator=generator, device=device))

    def objective(self, idx, views, *replace):
        _, loss = self.lm_loss(self.predict(idx, views, *replace), idx, views.target_pos)
        return loss, {}

    def predict(self, idx, views, u=None, noise=None):
        """The last layer's states (N, M, C) at each view's targets; idx (N, T) holds each view's row as embedding
        ids. Every layer runs over the whole sequence, with <mask> at the targets, or the 80/10/10 rule given its
        draws u and noise (draw())."""
        masked = corrupt(idx, views.target_pos, self.config.mask_token_id, u, noise)
        h, _ = self.run_encoder(masked, torch.arange(idx.size(1), device=idx.device))  # (N, T, C)
        # the LM head, the costliest matmul of a small model, runs only where there is a target
        return h.gather(1, views.target_pos[..., None].expand(-1, -1, h.size(-1)))     # (N, M, C)

    def fill(self, idx, views):
        """MaskedLM.fill with <mask> at every target, even for a model trained with 80/10/10: that rule corrupts
        training inputs, and the targets it leaves as they are would show the model the answer."""
        return self.lm_logits(self.predict(idx, views))


class CrossBERT(MaskedLM):
    model_type = "crossbert"

    def __init__(self, config):
        super().__init__(config)
        self.mask_query = nn.Parameter(torch.zeros(config.n_embd))
        self.predictor = nn.ModuleList(Block(config) for _ in range(config.pred_layer))
        self.ln_p = nn.LayerNorm(config.n_embd, bias=False)
        self.init_weights()
        nn.init.normal_(self.mask_query, std=config.init_std)

    def predict(self, idx, views, attn_mask=None):
        """The predictor's states (N, M, C) at each view's targets; idx (N, T) holds each view's row as embedding ids.
        attn_mask (N, 1, 1, K): which visible positions are keys (padding is not), for rows of ragged views."""
        # the encoder sees the visible tokens only, each at its original position
        mem, _ = self.run_encoder(idx.gather(1, views.visible_pos), views.visible_pos, attn_mask)  # (N, K, C)
        # the predictor's queries know nothing but where they are: one learned vector, rotated by target position
        q = self.mask_query.expand(*views.target_pos.shape, -1)                        # (N, M, C)
        rope_q, rope_mem = self.rope(views.target_pos), self.rope(views.visible_pos)
        for block in self.predictor:  # cross-attention to mem only: the queries never see each other
            q = block(q, rope_q, mem, rope_mem, attn_mask)
        return self.ln_p(q)


class ELECTRA(MaskedLM):
    """The encoder stack is the discriminator; the generator shares its token embeddings."""
    model_type = "electra"

    def __init__(self, config):
        super().__init__(config)
        C = config.n_embd
        g = config.gen_config  # a narrow BERT, with the discriminator's head size
        self.gen_in = nn.Linear(C, g.n_embd, bias=False)   # the shared embeddings, down to the generator's width
        self.generator = nn.ModuleList(Block(g) for _ in range(config.gen_layer))
        self.ln_g = nn.LayerNorm(g.n_embd, bias=False)
        self.gen_out = nn.Linear(g.n_embd, C, bias=False)  # and back up, for the LM head
        self.rtd_head = nn.Linear(C, 1)                    # per position: was this token replaced?
        self.init_weights()

    def run_generator(self, idx, target_pos):
        """The generator: BERT's masked-token prediction, at its own width, on embedding ids idx (N, T) with
        <mask> at target_pos (N, M). Returns its logits (N, M, vocab) there and its loss."""
        masked = corrupt(idx, target_pos, self.config.mask_token_id)
        return self.lm_loss(self.generator_states(masked, target_pos), idx, target_pos)

    def generator_states(self, idx, target_pos, attn_mask=None):
        """The generator's states at target_pos (N, M, C), back at the LM head's width, reading idx (N, T) as it is
        (<mask> already at the targets); attn_mask (N, 1, 1, T): which positions are keys (padding is not)."""
        rope = self.rope(torch.arange(idx.size(1), device=idx.device))
        x = self.gen_in(self.embed(idx))
        for block in self.generator:
            x = block(x, rope, attn_mask=attn_mask)
        x = x.gather(1, target_pos[..., None].expand(-1, -1, x.size(-1)))  # (N, M, Cg): only targets need the head
        return self.gen_out(self.ln_g(x))

    def fill(self, idx, views):
        """Its generator's logits (N, M, vocab) at each view's targets: the discriminator fills nothing."""
        return self.run_generator(idx, views.target_pos)[0]

    def discriminate(self, idx):
        """The discriminator's logits (N, T) that each token of idx (embedding ids) replaced the original."""
        h, _ = self.run_encoder(idx, torch.arange(idx.size(1), device=idx.device))  # (N, T, C)
        return self.rtd_head(h).squeeze(-1).float()

    def draw(self, B, T, generator=None, device=None):
        """The views, and the uniforms u (N, M) in [0, 1) that pick the generator's samples by inverse CDF."""
        views, = super().draw(B, T, generator, device)
        return views, torch.rand(views.target_pos.shape, generator=generator, device=device)

    def objective(self, idx, views, u):
        """Replaced-token detection: the generator's MLM loss + rtd_weight x the RTD loss, and its parts (detached):
        mlm_loss (the generator's), rtd_loss, rtd_accuracy, and replaced, the share of positions replaced (1 - the
        accuracy of answering "original" everywhere)."""
        logits, mlm_loss = self.run_generator(idx, views.target_pos)
        # sampling is not differentiated (as in ELECTRA): the samples are integers, so the RTD loss sends no gradient
        # to the generator through them, and detach() keeps the sampling out of the graph. Only text ids are drawn
        # (those below <mask>), so the discriminator never meets <mask> or <pad>
        text_logits = logits.detach()[..., :self.config.mask_token_id]
        replaced, is_replaced = replace_tokens(idx, views.target_pos, text_logits, u)
        rtd_logits = self.discriminate(replaced)  # (N, T)
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits, is_replaced.float())
        with torch.no_grad():
            stats = dict(mlm_loss=mlm_loss.detach(), rtd_loss=rtd_loss.detach(),
                         rtd_accuracy=((rtd_logits > 0) == is_replaced).float().mean(),
                         replaced=is_replaced.float().mean())
        return mlm_loss + self.config.rtd_weight * rtd_loss, stats


def replace_tokens(idx, target_pos, logits, u):
    """The discriminator's input and labels: idx (N, T) with a sample of softmax(logits) (N, M, vocab) at
    target_pos (N, M), drawn by inverse CDF from the uniforms u (N, M); labels (N, T) say where the token
    now differs from the original. A sample that equals the original counts as original, as in ELECTRA."""
    cdf = torch.softmax(logits, -1, dtype=torch.float32).cumsum_(-1)  # one (N, M, vocab) fp32 temporary
    sampled = torch.searchsorted(cdf, (u * cdf[..., -1])[..., None]).squeeze(-1)  # u < 1: always below vocab
    replaced = idx.scatter(1, target_pos, sampled)
    return replaced, replaced != idx


MODELS = {"bert": BERT, "crossbert": CrossBERT, "electra": ELECTRA}


# ----------------------------------------------------------------------------
# Their parts: rotary embeddings by position, attention, MLP, pre-norm block

def rope_tables(config):
    """cos and sin of every (position, frequency) pair, precomputed once."""
    head_dim = config.n_embd // config.n_head
    freqs = config.rope_base ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(config.block_size).float(), freqs)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """Rotary embedding of x (N, H, T, D) by angles (.., T, D/2) of each token's own position."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # under autocast x is bf16: keep q and k there, not in fp32
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Multi-head attention of x over mem (mem is x for self-attention), with RoPE on both sides."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.kv = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, rope_x, mem, rope_mem, attn_mask=None):
        N, T, C = x.shape                    # T queries; mem is (N, S, C): S keys, S = T in self-attention
        H, S = self.n_head, mem.size(1)
        q = self.q(x).view(N, T, H, C // H).transpose(1, 2)                      # (N, H, T, D), D = C // H
        # kv(mem) is (N, S, 2C): the C channels of k, then those of v, each H heads of D. View the last axis as
        # (2, H, D), then move k/v to the front and heads before positions: k and v are each (N, H, S, D), like q
        k, v = self.kv(mem).view(N, S, 2, H, C // H).permute(2, 0, 3, 1, 4)       # (2, N, H, S, D)
        # queries rotate by their own positions and keys by theirs, so scores see relative offsets
        q, k = rotate(q, *rope_x), rotate(k, *rope_mem)
        # no mask in training (fixed windows), which keeps the FlashAttention kernel available
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)  # (N, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(N, T, C))  # heads side by side again: (N, T, C)


class MLP(nn.Module):
    """GeGLU (as ModernBERT's): fc makes a value and a gate, and GELU(gate) scales the value; or a plain GELU MLP."""

    def __init__(self, config):
        super().__init__()
        self.gated = config.mlp == "geglu"
        self.fc = nn.Linear(config.n_embd, (2 if self.gated else 1) * config.mlp_hidden, bias=False)
        self.proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):
        if not self.gated:
            return self.proj(F.gelu(self.fc(x)))
        value, gate = self.fc(x).chunk(2, dim=-1)
        return self.proj(value * F.gelu(gate))


class Block(nn.Module):
    """Pre-norm block. Self-attention when mem is None, else cross-attention to mem only."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, rope, mem=None, rope_mem=None, attn_mask=None):
        h = self.ln_1(x)
        if mem is None:
            mem, rope_mem = h, rope
        x = x + self.drop(self.attn(h, rope, mem, rope_mem, attn_mask))
        return x + self.drop(self.mlp(self.ln_2(x)))


class PredictionHead(nn.Module):
    """The MLM prediction head (BERT's and ModernBERT's): one more transform between the last states and the tied
    decoder, so the layer that the probes read need not be the decoder's input."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ln = nn.LayerNorm(config.n_embd, bias=False)

    def forward(self, h):
        return self.ln(F.gelu(self.dense(h)))


# ----------------------------------------------------------------------------
# The checks of a config's fields, as given (None: the model's default, filled in after)

def check_config(config):
    """A ValueError that names the setting and the fix, for a field no model can have."""
    if config.model_type not in ("bert", "crossbert", "electra"):
        raise ValueError(f"model_type={config.model_type!r}: expected one of bert, crossbert, electra")
    for name in ("n_layer", "n_head", "n_embd", "block_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)}: must be at least 1")
    if config.n_embd % config.n_head or (config.n_embd // config.n_head) % 2:
        fits = next(h for h in range(config.n_head, 0, -1) if config.n_embd % h == 0 and (config.n_embd // h) % 2 == 0)
        raise ValueError(f"n_embd={config.n_embd} must split into n_head={config.n_head} heads of an even size "
                         f"(rotary embeddings rotate pairs); e.g. n_head={fits}")
    if config.mlp not in ("geglu", "gelu"):
        raise ValueError(f"mlp={config.mlp!r}: expected geglu or gelu")
    if not 4 <= config.vocab_size <= config.token_ids:
        raise ValueError(f"vocab_size={config.vocab_size}: a compact vocabulary has 4 to {config.token_ids} ids "
                         "(0 in the scripts' settings: GPT-2's full vocabulary)")
    if config.pred_layer is not None and config.pred_layer < 1:
        raise ValueError(f"pred_layer={config.pred_layer}: CrossBERT needs a predictor of at least 1 block "
                         "(or None for n_layer // 4)")
    if config.gen_layer is not None and config.gen_layer < 1:
        raise ValueError(f"gen_layer={config.gen_layer}: ELECTRA needs a generator of at least 1 block (or None for "
                         "n_layer)")
    if not 0 < config.gen_width <= 1:
        raise ValueError(f"gen_width={config.gen_width}: ELECTRA's generator width is a fraction of n_embd, in (0, 1]")
    if config.mask_ratio is not None and not 0 < config.mask_ratio < 1:
        raise ValueError(f"mask_ratio={config.mask_ratio}: must be strictly between 0 and 1")
    if config.model_type == "electra" and config.random_replace:
        raise ValueError("random_replace (BERT's 80/10/10) would show ELECTRA's generator some of the tokens it "
                         "must predict; leave it off for ELECTRA")
