"""
BERT, CrossBERT and ELECTRA: the paper's model and its two baselines, built of one pre-norm block.

- BERT: <mask> at the targets, every layer over the whole sequence, the LM head at the targets.
- CrossBERT: the encoder sees the visible tokens only (masked ones are dropped, as in MAE); a shallow predictor of
  cross-attention-only blocks fills the targets from the encoder's states, so the encoder never reconstructs.
- ELECTRA: a narrow generator fills BERT's masks; the encoder (the discriminator) says which tokens were replaced.
- forward(idx, *draws) -> (loss, stats): draws are draw()'s random inputs (the views; BERT's 80/10/10 and ELECTRA's
  sampling draws), drawn inside when not given; encode() gives the frozen features of the unmasked input.
- Shapes: B input rows, N views (B x views a row), T positions, K visible and M target positions a view, C channels.
"""
import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from masking import corrupt, make_views, replace_tokens, view_shape


@dataclass
class ModelConfig:
    model_type: str = "crossbert"    # bert | crossbert | electra
    block_size: int = 128
    vocab_size: int = 50304          # GPT-2's 50257 ids + <mask> + <pad>, padded to a multiple of 64; fewer: a compact
                                     # vocabulary (data/tokenizer.compact_vocab: <mask> and <pad> are its last two ids)
    n_layer: int = 2                 # encoder depth
    n_head: int = 2
    n_embd: int = 128
    dropout: float = 0.0
    init_std: float = 0.02           # the paper lowered it to stabilise its largest model
    mask_ratio: float | None = None  # None: the model's default, BERT 0.2, CrossBERT 0.5, ELECTRA 0.15
    cms: bool | None = None          # complementary views; None: CrossBERT's alone
    random_replace: bool | None = None  # BERT's 80/10/10 (80% <mask>, 10% a random token, 10% unchanged); False:
                                        # every target <mask>; None: on for BERT (the stronger baseline: LOG.md)
    pred_layer: int | None = None    # CrossBERT's predictor depth; None: max(1, n_layer // 4)
    gen_width: float = 0.25          # ELECTRA's generator width, a fraction of n_embd (rounded to whole heads)
    gen_layer: int | None = None     # ELECTRA's generator depth; None: n_layer
    rtd_weight: float = 50.0         # ELECTRA's loss: generator MLM + rtd_weight x replaced-token detection

    def __post_init__(self):  # short checks (a ValueError names the setting), then the defaults left at None
        def need(ok, message):
            if not ok:
                raise ValueError(message)
        need(self.model_type in MODELS, f"model_type={self.model_type!r}: expected one of bert, crossbert, electra")
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            need(getattr(self, name) >= 1, f"{name}={getattr(self, name)}: must be at least 1")
        need(self.n_embd % self.n_head == 0 and self.n_embd // self.n_head % 2 == 0, f"n_embd={self.n_embd} must "
             f"split into n_head={self.n_head} heads of an even size (rotary embeddings rotate pairs)")
        need(4 <= self.vocab_size <= 50304, f"vocab_size={self.vocab_size}: a compact vocabulary has 4 to 50304 ids")
        need(self.pred_layer is None or self.pred_layer >= 1,
             f"pred_layer={self.pred_layer}: CrossBERT needs a predictor of at least 1 block")
        need(self.gen_layer is None or self.gen_layer >= 1,
             f"gen_layer={self.gen_layer}: ELECTRA needs a generator of at least 1 block")
        need(0 < self.gen_width <= 1, f"gen_width={self.gen_width}: ELECTRA's generator width is a fraction of "
             "n_embd, in (0, 1]")
        need(not (self.random_replace and self.model_type == "electra"), "random_replace (BERT's 80/10/10) would show "
             "ELECTRA's generator some of the tokens it must predict; leave it off for ELECTRA")
        if self.mask_ratio is None:
            self.mask_ratio = {"bert": 0.2, "crossbert": 0.5, "electra": 0.15}[self.model_type]
        self.cms = self.model_type == "crossbert" if self.cms is None else self.cms
        self.random_replace = self.model_type == "bert" if self.random_replace is None else self.random_replace
        self.pred_layer = self.pred_layer or max(1, self.n_layer // 4)
        self.gen_layer = self.gen_layer or self.n_layer
        view_shape(self.block_size, self.mask_ratio, self.cms)  # the views must cut the block (a ValueError if not)

    @property
    def views(self):  # (V, K, M): views a row, visible and predicted positions a view (masking.view_shape)
        return view_shape(self.block_size, self.mask_ratio, self.cms)

    @property
    def mask_token_id(self):  # GPT-2's 50257, or a compact vocabulary's second-to-last id
        return 50257 if self.vocab_size > 50257 else self.vocab_size - 2

    @property
    def mlp_hidden(self):  # GeGLU's 8/3 x n_embd to a multiple of 32: a 4 x GELU MLP's parameters (our choice)
        return max(32, round(8 * self.n_embd / 3 / 32) * 32)

    @property
    def gen_config(self):
        """ELECTRA's generator blocks: a narrow BERT, gen_width of the width in whole heads of the same size."""
        head_size = self.n_embd // self.n_head
        n_head = max(1, round(self.gen_width * self.n_head))
        return replace(self, model_type="bert", n_embd=n_head * head_size, n_head=n_head)


# ----------------------------------------------------------------------------
# What the three models share: the embeddings, the encoder stack, the tied LM head, encode()

class MaskedLM(nn.Module):
    model_type = None  # each model's; its config must name the same
    def __init__(self, config):
        super().__init__()
        assert config.model_type == self.model_type, f"{type(self).__name__} takes model_type={self.model_type!r}"
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.ln_e = nn.LayerNorm(config.n_embd, bias=False)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        # the LM head: a prediction head, then the decoder tied to wte, with a bias (the token frequencies live there)
        self.head = PredictionHead(config)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        cos, sin = rope_tables(config.n_embd // config.n_head, config.block_size)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def init_weights(self):
        for name, p in self.named_parameters():
            if p.dim() >= 2:  # residual projections shrink with depth, so the residual stream's variance stays put
                scale = 1 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj.weight") else 1
                nn.init.normal_(p, mean=0.0, std=self.config.init_std * scale)

    def rope(self, pos):  # rotary angles of positions pos (T,) or (N, T), to broadcast over heads
        return self.cos[pos].unsqueeze(-3), self.sin[pos].unsqueeze(-3)

    def run_encoder(self, idx, pos, attn_mask=None, layers=()):
        """The encoder on ids idx (N, T) at positions pos: its final-normed states (N, T, C), and a dict of the states
        of `layers` (0: the token embeddings; the final norm on each, so all are on one scale)."""
        rope = self.rope(pos)
        x = self.drop(self.ln_e(self.wte(idx)))
        kept = {0: self.ln_f(x)} if 0 in layers else {}
        for i, block in enumerate(self.blocks, start=1):
            x = block(x, rope, attn_mask=attn_mask)
            if i in layers:
                kept[i] = self.ln_f(x)
        return self.ln_f(x), kept

    def draw(self, B, T, generator=None, device=None):
        """A training step's random inputs, which follow idx in forward(): the views (masking.py). A trainer draws
        them from its own generator, so they are a function of its seed and not of how a batch is split."""
        return (make_views(B, T, self.config.mask_ratio, self.config.cms, generator=generator, device=device),)

    def forward(self, idx, *draws):
        """Pretraining on ids idx (B, T): the loss, and a dict of detached scalars to log (a composite loss's parts)."""
        views, *rest = draws or self.draw(*idx.shape, device=idx.device)
        return self.objective(idx[views.rows], views, *rest)  # idx[views.rows]: each view's row (N, T)

    def objective(self, idx, views, *rest):
        """BERT's and CrossBERT's: cross-entropy of the LM head on predict()'s states at the targets."""
        return self.lm_loss(self.predict(idx, views, *rest), idx, views.target_pos)[1], {}

    def lm_logits(self, h):  # (.., vocab) of states h (.., C)
        return F.linear(self.head(h), self.wte.weight, self.decoder_bias)

    def lm_loss(self, h, idx, target_pos):
        """(logits, loss) of the LM head on states h (N, M, C) against idx's ids at target_pos (N, M)."""
        logits = self.lm_logits(h)
        return logits, F.cross_entropy(logits.float().flatten(0, 1), idx.gather(1, target_pos).flatten())

    def fill(self, idx, views):
        """Logits (N, M, vocab) of what the model puts at each view's targets, the way it learned to (sample.py)."""
        return self.lm_logits(self.predict(idx, views))

    def encode(self, idx, attention_mask=None, layers=None):
        """Frozen features of the unmasked input idx (B, T): the last layer's states (B, T, C), or a list of `layers`
        (0: the token embeddings, 1..n_layer: the blocks). attention_mask (B, T): 0 at padding, which no key is."""
        T, L = idx.size(1), self.config.n_layer
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}; truncate the input")
        wanted = [L] if layers is None else list(layers)
        if not all(0 <= i <= L for i in wanted):
            raise ValueError(f"layers {wanted}: the encoder has layers 0..{L} (0: the embeddings)")
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        _, kept = self.run_encoder(idx, torch.arange(T, device=idx.device), mask, wanted)
        return kept[L] if layers is None else [kept[i] for i in wanted]

    def num_params(self, non_embedding=False):
        n = sum(p.numel() for p in self.parameters())
        return n - self.wte.weight.numel() if non_embedding else n

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        # decay the matrices of linear layers only: not the embeddings, norms, biases or the mask query
        decay = [p for n, p in self.named_parameters() if p.dim() >= 2 and n != "wte.weight"]
        other = [p for n, p in self.named_parameters() if p.dim() < 2 or n == "wte.weight"]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]
        # fused: one kernel for every parameter; on a CPU the default loop of small ops costs 2-3x more
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))


# ----------------------------------------------------------------------------
# CrossBERT: the paper's model

class CrossBERT(MaskedLM):
    model_type = "crossbert"

    def __init__(self, config):
        super().__init__(config)  # the encoder
        self.mask_query = nn.Parameter(torch.zeros(config.n_embd))
        self.predictor = nn.ModuleList(Block(config) for _ in range(config.pred_layer))
        self.ln_p = nn.LayerNorm(config.n_embd, bias=False)
        self.init_weights()
        nn.init.normal_(self.mask_query, std=config.init_std)

    def predict(self, idx, views, attn_mask=None):
        """The predictor's states (N, M, C) at each view's targets; idx (N, T) holds each view's row. attn_mask
        (N, 1, 1, K): which visible positions are keys, for rows of ragged views (padding is not)."""
        # --- the encoder: the visible tokens only, each at its original position
        mem, _ = self.run_encoder(idx.gather(1, views.visible_pos), views.visible_pos, attn_mask)  # (N, K, C)
        # --- the predictor: queries that know nothing but where they are, one learned vector rotated by position
        q = self.mask_query.expand(*views.target_pos.shape, -1)                                   # (N, M, C)
        rope_q, rope_mem = self.rope(views.target_pos), self.rope(views.visible_pos)
        for block in self.predictor:  # cross-attention to mem only: the queries never see each other
            q = block(q, rope_q, mem, rope_mem, attn_mask)
        return self.ln_p(q)


# ----------------------------------------------------------------------------
# BERT: the flat baseline

class BERT(MaskedLM):
    model_type = "bert"

    def __init__(self, config):
        super().__init__(config)
        self.init_weights()

    def draw(self, B, T, generator=None, device=None):
        """The views, and with random_replace the 80/10/10 draws at each target (masking.corrupt): uniforms u (N, M)
        and random ids (N, M) below <mask>."""
        views, = super().draw(B, T, generator, device)
        if not self.config.random_replace:
            return (views,)
        shape = views.target_pos.shape
        return (views, torch.rand(shape, generator=generator, device=device),
                torch.randint(0, self.config.mask_token_id, shape, generator=generator, device=device))

    def predict(self, idx, views, u=None, noise=None):
        """The last layer's states (N, M, C) at the targets. Every layer reads the whole row, with <mask> at the
        targets, or the 80/10/10 rule given its draws (fill() never gives them: it shows the model no answer)."""
        masked = corrupt(idx, views.target_pos, self.config.mask_token_id, u, noise)
        h, _ = self.run_encoder(masked, torch.arange(idx.size(1), device=idx.device))  # (N, T, C)
        # the LM head, the costliest matmul of a small model, runs only where there is a target
        return h.gather(1, views.target_pos[..., None].expand(-1, -1, h.size(-1)))     # (N, M, C)


# ----------------------------------------------------------------------------
# ELECTRA: replaced-token detection, the other baseline

class ELECTRA(MaskedLM):
    """The encoder stack is the discriminator; the generator shares its token embeddings."""
    model_type = "electra"

    def __init__(self, config):
        super().__init__(config)
        C, G = config.n_embd, config.gen_config.n_embd
        self.gen_in = nn.Linear(C, G, bias=False)  # the shared embeddings, down to the generator's width
        self.generator = nn.ModuleList(Block(config.gen_config) for _ in range(config.gen_layer))
        self.ln_g = nn.LayerNorm(G, bias=False)
        self.gen_out = nn.Linear(G, C, bias=False)  # and back up, for the LM head
        self.rtd_head = nn.Linear(C, 1)             # per position: was this token replaced?
        self.init_weights()

    def draw(self, B, T, generator=None, device=None):  # the views, and uniforms (N, M) that pick the samples
        views, = super().draw(B, T, generator, device)
        return views, torch.rand(views.target_pos.shape, generator=generator, device=device)

    def run_generator(self, idx, target_pos):
        """BERT's job at the generator's width, <mask> at target_pos (N, M): its (logits, loss) there."""
        masked = corrupt(idx, target_pos, self.config.mask_token_id)
        return self.lm_loss(self.generator_states(masked, target_pos), idx, target_pos)

    def generator_states(self, idx, target_pos, attn_mask=None):
        """The generator's states (N, M, C) at target_pos, back at the LM head's width, reading idx (N, T) as it is."""
        rope = self.rope(torch.arange(idx.size(1), device=idx.device))
        x = self.gen_in(self.drop(self.ln_e(self.wte(idx))))
        for block in self.generator:
            x = block(x, rope, attn_mask=attn_mask)
        x = x.gather(1, target_pos[..., None].expand(-1, -1, x.size(-1)))  # (N, M, G): only the targets need the head
        return self.gen_out(self.ln_g(x))

    def fill(self, idx, views):  # the generator's fills: the discriminator fills nothing
        return self.run_generator(idx, views.target_pos)[0]

    def discriminate(self, idx):  # logits (N, T) that each token of idx was replaced
        h, _ = self.run_encoder(idx, torch.arange(idx.size(1), device=idx.device))
        return self.rtd_head(h).squeeze(-1).float()

    def objective(self, idx, views, u):
        """The generator's MLM loss + rtd_weight x the RTD loss, and its parts (detached)."""
        logits, mlm_loss = self.run_generator(idx, views.target_pos)
        # samples are integers, so the RTD loss sends the generator no gradient (as in ELECTRA); only text ids (below
        # <mask>) are drawn, so the discriminator never meets <mask> or <pad>
        text_logits = logits.detach()[..., :self.config.mask_token_id]
        replaced, is_replaced = replace_tokens(idx, views.target_pos, text_logits, u)
        rtd_logits = self.discriminate(replaced)  # (N, T)
        rtd_loss = F.binary_cross_entropy_with_logits(rtd_logits, is_replaced.float())
        stats = dict(mlm_loss=mlm_loss.detach(), rtd_loss=rtd_loss.detach(),
                     rtd_accuracy=((rtd_logits.detach() > 0) == is_replaced).float().mean(),
                     replaced=is_replaced.float().mean())
        return mlm_loss + self.config.rtd_weight * rtd_loss, stats


MODELS = {"bert": BERT, "crossbert": CrossBERT, "electra": ELECTRA}


# ----------------------------------------------------------------------------
# The block: rotary positions, attention, a GeGLU MLP, pre-norm (each part measured: experiments/LOG.md)

def rope_tables(head_dim, block_size, base=10000.0):
    """cos and sin of every (position, frequency) pair, precomputed once."""
    freqs = base ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(block_size).float(), freqs)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """x (N, H, T, D) rotated by the angles (.., T, D/2) of each token's own position."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # under autocast x is bf16: keep q and k there, not in fp32
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Multi-head attention of x over mem (mem is x for self-attention), with RoPE on both sides."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.dropout = config.n_head, config.dropout
        self.q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.kv = nn.Linear(config.n_embd, 2 * config.n_embd, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, rope_x, mem, rope_mem, attn_mask=None):
        N, T, C = x.shape                    # T queries over S keys of mem (N, S, C); S = T in self-attention
        H, S = self.n_head, mem.size(1)
        q = self.q(x).view(N, T, H, C // H).transpose(1, 2)                 # (N, H, T, D)
        k, v = self.kv(mem).view(N, S, 2, H, C // H).permute(2, 0, 3, 1, 4)  # each (N, H, S, D)
        # queries rotate by their own positions and keys by theirs, so the scores see relative offsets
        q, k = rotate(q, *rope_x), rotate(k, *rope_mem)
        # no mask in training (fixed windows), which keeps the FlashAttention kernel available
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.dropout if self.training else 0.0)  # (N, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(N, T, C))


class MLP(nn.Module):
    """GeGLU, as ModernBERT's: fc makes a value and a gate, and GELU(gate) scales the value."""

    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=False)
        self.proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):
        value, gate = self.fc(x).chunk(2, dim=-1)
        return self.proj(value * F.gelu(gate))


class Block(nn.Module):
    """Pre-norm block: self-attention when mem is None, else cross-attention to mem only; then the MLP."""

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
    """BERT's MLM prediction head (dense, GELU, LayerNorm) before the tied decoder, so the layer the probes read
    need not be the decoder's input."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ln = nn.LayerNorm(config.n_embd, bias=False)

    def forward(self, h):
        return self.ln(F.gelu(self.dense(h)))
