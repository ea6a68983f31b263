"""
The exported model in HF transformers. export.py writes this file beside the weights, with copies of model.py,
masking.py and the poolers (poolers.py: embeddings/vectors.py's), so that

    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    out = AutoModel.from_pretrained(folder, trust_remote_code=True)(**batch)
    out.last_hidden_state   # (B, T, C): model.py's encode(), the encoder's last layer (padding ignored)
    out.pooler_output       # (B, C): embed.py's unit-norm sentence embedding (the exported pooler, or mean pooling)
    mlm = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)
    mlm(**batch).logits     # the fills of its <mask>s
    mlm(**batch, labels=labels).loss   # training's loss at the positions labels holds (-100 elsewhere): the Trainer and
                                       # DataCollatorForLanguageModeling continue pretraining
    AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=2)  # to fine-tune

runs the very model.py the encoder was trained with, not a second implementation of it. Every family's encoder (BERT's
layers, CrossBERT's encoder, ELECTRA's discriminator) is model.py's shared stack: the token embedding, the blocks and
the final norm. A BERT without its LM head is exactly that stack, so that is what the encoder's classes build; the
masked-LM class builds the trained model whole, to fill masks with the part of it that learned to (BERT's LM head,
CrossBERT's predictor, ELECTRA's generator).

The inputs are GPT-2 token ids, as the tokenizer gives them; each class maps them through the vocabulary map the model
was trained with (`vocab_map`, among the weights: a compact vocabulary sends rare ids to its <unk>) before model.py
sees them. The weights keep model.py's names under `model.`: the encoder's classes read the shared stack's and leave the
rest; the task heads hold the encoder model as `crossbert` (base_model_prefix), so transformers finds the export's
weights for it, and `model.base_model` is what a user freezes to train the head alone.

transformers' conventions: output_hidden_states (model.encode()'s layers: the embeddings, then each block), return_dict,
get/set_input_embeddings, resize_token_embeddings (a row for each token added to the tokenizer), activation (gradient)
checkpointing of model.py's blocks, attn_implementation "sdpa" (the default; model.py's attention is always torch's
SDPA). What the model cannot give is refused in one line: output_attentions (SDPA returns no weights); and a folder that
lacks weights a class needs (other than a new task head) does not load.
"""
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutputWithPooling, MaskedLMOutput, SequenceClassifierOutput,
                                           TokenClassifierOutput)

from .masking import Views, replace_tokens
from .model import BERT, MODELS, Block, MaskedLM, ModelConfig, rope_tables
from .poolers import POOLERS, mean_pool


class CrossBERTEncoderConfig(PretrainedConfig):
    model_type = "crossbert_encoder"

    def __init__(self, encoder=None, masked_lm=None, pooler=None, trained_as=None, added_tokens=0, **kwargs):
        self.encoder = encoder or {}    # model.ModelConfig's fields, of the BERT whose LM head is dropped
        self.masked_lm = masked_lm      # the trained model's ModelConfig fields, where the export holds what fills
                                        # masks; None: the encoder alone
        self.pooler = pooler            # None (mean pooling), or one of POOLERS: {"kind", "n_embd", "n_head"}
        self.trained_as = trained_as    # the family that trained the encoder: bert, crossbert or electra
        self.added_tokens = added_tokens  # tokens added to the tokenizer (ids from unk_token_id + 1 on), each with a
                                          # row of its own (resize_token_embeddings)
        super().__init__(**kwargs)


class CrossBERTPreTrainedModel(PreTrainedModel):
    config_class = CrossBERTEncoderConfig
    base_model_prefix = "crossbert"
    _supports_sdpa = True  # the default attn_implementation; model.py computes attention with SDPA alone
    supports_gradient_checkpointing = True  # model.py's blocks (_set_gradient_checkpointing)
    _new_weights = ()  # name prefixes of weights a class initialises itself when the folder lacks them (a task head)
    # an export holds the filling part beside the encoder (LM head, predictor or generator): the encoder's classes
    # leave it unread, without a warning
    _keys_to_ignore_on_load_unexpected = [r"^model\.(?!(wte|ln_e|blocks|ln_f)\.)"]
    accepts_loss_kwargs = False  # the losses are batch means: the Trainer scales them for gradient accumulation

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained, refusing a folder that lacks weights the class needs: transformers would
        leave them as memory was (NaN fills), with a note in its load report alone."""
        wanted = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(k for k in info["missing_keys"] if not k.startswith(cls._new_weights))
        if missing:
            raise ValueError(f"{args[0] if args else kwargs.get('pretrained_model_name_or_path')} lacks {len(missing)} "
                             f"weights {cls.__name__} needs ({', '.join(missing[:3])}, ...): load the folder "
                             "hf/export.py wrote (without --encoder_only to fill masks)")
        return (model, info) if wanted else model

    def get_input_embeddings(self):
        """The token embedding (model.py's wte), whose rows are the model's ids: vocab_map maps GPT-2 ids to them."""
        return self.base_model.model.wte

    def set_input_embeddings(self, value):
        self.base_model.model.wte = value

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' resize after tokenizer.add_tokens: the model reads new_num_tokens token ids (rounded up to a
        multiple of pad_to_multiple_of), each id past the tokenizer's own (from unk_token_id + 1 on) with a row of its
        own in the token embedding (and the LM head's bias), set to the mean of the rows or, with mean_resizing=False,
        as model.py initialises. The ids it read before keep their rows, so their outputs do not change. A compact
        vocabulary grows by the new rows, below its <mask> and <pad> (its last two rows, model.py's rule); GPT-2's
        vocabulary gives them its spare rows, the ids' own past <unk>. Returns the token embedding."""
        base, cfg, m = self.base_model, self.config, self.base_model.model
        if new_num_tokens is None:
            return self.get_input_embeddings()
        first, n = cfg.unk_token_id + 1, new_num_tokens
        if pad_to_multiple_of:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        k = n - first - cfg.added_tokens  # the ids added now
        if k < 0:
            raise ValueError(f"resize_token_embeddings({n}): the tokenizer's ids and those added to it are "
                             f"{first + cfg.added_tokens}; it grows to a tokenizer's length (len(tokenizer)), not below")
        grow = m.config.mask_token_id == m.config.vocab_size - 2
        # a compact vocabulary stays below GPT-2's <mask> and <pad> (model.py's rule), GPT-2's has its spare rows
        room = cfg.mask_token_id + 2 - m.config.vocab_size if grow else m.config.vocab_size - n + k
        if k > room:
            raise ValueError(f"resize_token_embeddings({n}): the model has room for {room} more tokens, not {k}")
        at = m.config.vocab_size - 2 if grow else first + cfg.added_tokens  # the first new row

        def put(w, new):  # w with rows `new` from `at` on: inserted, or in place of the spare rows there
            return torch.cat([w[:at], new.to(w), w[at + (0 if grow else k):]])

        old = m.wte.weight.detach()
        m.wte = nn.Embedding(len(old) + k * grow, old.size(1), device=old.device, dtype=old.dtype)
        m.wte.weight.data = put(old, old.mean(0).expand(k, -1) if mean_resizing
                                else torch.randn(k, old.size(1)) * m.config.init_std)
        if m.decoder_bias is not None:
            bias = m.decoder_bias.detach()
            m.decoder_bias = nn.Parameter(put(bias, bias.mean().expand(k) if mean_resizing else bias.new_zeros(k)))
        vmap = base.vocab_map[:first + cfg.added_tokens]
        base.vocab_map = torch.cat([vmap + k * grow * (vmap >= at), torch.arange(at, at + k, device=vmap.device)])
        m.config.vocab_size += k * grow
        for part in (cfg.encoder, cfg.masked_lm):
            if part is not None:
                part["vocab_size"] = m.config.vocab_size
        cfg.vocab_size, cfg.added_tokens = n, n - first
        return m.wte

    def _set_gradient_checkpointing(self, enable=True, gradient_checkpointing_func=checkpoint, every_n_layers=1):
        """transformers' activation checkpointing (gradient_checkpointing_enable and disable; the Trainer's
        gradient_checkpointing=True) on model.py's blocks, every every_n_layers-th: in training, a block keeps only its
        input and runs again in the backward pass. The weights and what they compute are unchanged."""
        for i, block in enumerate(m for m in self.modules() if isinstance(m, Block)):
            block.gradient_checkpointing = enable and i % every_n_layers == 0  # what transformers reads back
            block.forward = partial(recomputed, block, gradient_checkpointing_func)

    def outputs(self, out, return_dict):
        """transformers' output object, or its tuple (return_dict=False)."""
        return out if (self.config.return_dict if return_dict is None else return_dict) else out.to_tuple()

    @torch.no_grad()
    def _init_weights(self, module):
        # model.py initialises its weights itself, and model.safetensors replaces them; but transformers builds the
        # model without memory first, so the rotary tables (computed, never saved) are computed here again, and a
        # vocabulary map the weights lack is the same ids, not memory as it was left. A task head is new: initialised
        # as model.py initialises its linear layers
        if isinstance(module, MaskedLM):
            cos, sin = rope_tables(module.config.n_embd // module.config.n_head, module.config.block_size)
            module.cos.copy_(cos)
            module.sin.copy_(sin)
        elif module is self and hasattr(module, "vocab_map"):
            module.vocab_map.copy_(token_map(self.config))
        elif module is getattr(self, "classifier", None):
            module.weight.normal_(std=ModelConfig(**self.config.encoder).init_std)
            module.bias.zero_()


def recomputed(block, checkpoint_func, *args, **kwargs):
    """model.py's Block.forward, under checkpoint_func when the block is checkpointed, training and has a backward."""
    if block.gradient_checkpointing and block.training and torch.is_grad_enabled():
        return checkpoint_func(Block.forward, block, *args, **kwargs)
    return Block.forward(block, *args, **kwargs)


def token_map(config):
    """A stand-in for the map from GPT-2 token ids to the model's (config.vocab_size,): the same ids. The map is a
    buffer saved with the weights, which replace it."""
    return torch.arange(config.vocab_size)


def no_attentions(config, output_attentions):
    if config.output_attentions if output_attentions is None else output_attentions:
        raise ValueError("output_attentions=True: model.py's attention is torch's scaled_dot_product_attention "
                         "(attn_implementation='sdpa'), which returns no attention weights")


class CrossBERTEncoderModel(CrossBERTPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        config.masked_lm = None  # its weights (and a task head's) are the encoder's alone: a save of it fills no mask
        self.model = BERT(ModelConfig(**config.encoder))
        self.model.head = self.model.decoder_bias = None  # the LM head: encode() never reads it, nor a task head
        self.register_buffer("vocab_map", token_map(config))
        p = config.pooler
        self.pooler = POOLERS[p["kind"]](p["n_embd"], p["n_head"]) if p else None
        self.post_init()

    def encode(self, input_ids, attention_mask=None, layers=None):
        """model.encode()'s states (B, T, C) of GPT-2 token ids (B, T), mapped to the model's ids first (a list of
        `layers`' states with layers)."""
        return self.model.encode(self.vocab_map[input_ids], attention_mask, layers)

    def states(self, input_ids, attention_mask=None, output_hidden_states=None, output_attentions=None):
        """The last layer's states (B, T, C), and transformers' hidden_states if asked: encode()'s layers, the
        embeddings then each block (each final-normed, as model.py's probes read them); else None."""
        no_attentions(self.config, output_attentions)
        if not (self.config.output_hidden_states if output_hidden_states is None else output_hidden_states):
            return self.encode(input_ids, attention_mask), None
        layers = self.encode(input_ids, attention_mask, range(self.model.config.n_layer + 1))
        return layers[-1], tuple(layers)

    def pool(self, input_ids, attention_mask, h):
        """The pooling (B, C) of the encoder's states h (B, T, C), the export's pooler or mean pooling, over the real
        tokens (attention_mask (B, T): 1 on tokens, 0 on padding)."""
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return mean_pool(h, mask) if self.pooler is None else self.pooler(h, mask)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        h, hidden = self.states(input_ids, attention_mask, output_hidden_states, output_attentions)
        pooled = F.normalize(self.pool(input_ids, attention_mask, h).float(), dim=-1)
        return self.outputs(BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=pooled,
                                                       hidden_states=hidden), return_dict)


# ----------------------------------------------------------------------------
# Task heads for fine-tuning, with transformers' conventions: labels, num_labels, problem_type; frozen or not is the
# user's choice (requires_grad on model.base_model's parameters)

class LinearHead(CrossBERTPreTrainedModel):
    """The exported encoder and a linear classifier on its states (what the task heads below share)."""
    _new_weights = ("classifier.",)

    def __init__(self, config):
        super().__init__(config)
        self.crossbert = CrossBERTEncoderModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


class CrossBERTForSequenceClassification(LinearHead):
    """A linear head on the export's pooling of the encoder's states: classification, or regression for num_labels=1."""

    def forward(self, input_ids, attention_mask=None, labels=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        h, hidden = self.crossbert.states(input_ids, attention_mask, output_hidden_states, output_attentions)
        logits = self.classifier(self.crossbert.pool(input_ids, attention_mask, h))
        return self.outputs(SequenceClassifierOutput(
            loss=None if labels is None else sequence_loss(self.config, logits, labels), logits=logits,
            hidden_states=hidden), return_dict)


def sequence_loss(config, logits, labels):
    """transformers' rule for a sequence head's loss: problem_type, when unset, is regression for one label,
    single-label classification for integer labels, else multi-label; it is written into the config, as there."""
    if config.problem_type is None:
        config.problem_type = ("regression" if config.num_labels == 1 else "single_label_classification"
                               if labels.dtype in (torch.long, torch.int) else "multi_label_classification")
    if config.problem_type == "regression":
        return F.mse_loss(logits.view(labels.shape), labels.to(logits.dtype))
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits, labels.view(-1))
    if config.problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
    raise ValueError(f"problem_type={config.problem_type!r}: expected regression, single_label_classification or "
                     "multi_label_classification")


class CrossBERTForTokenClassification(LinearHead):
    """A linear head on each of the encoder's states; labels of -100 (padding, a word's later pieces) are skipped."""

    def forward(self, input_ids, attention_mask=None, labels=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        h, hidden = self.crossbert.states(input_ids, attention_mask, output_hidden_states, output_attentions)
        logits = self.classifier(h)
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return self.outputs(TokenClassifierOutput(loss=loss, logits=logits, hidden_states=hidden), return_dict)


# ----------------------------------------------------------------------------
# Filling masks: each family the way it trained, as sample.py shows it (model.fill), on a padded batch. model.py's
# predict() and run_generator() run fixed windows without an attention mask, so the states at the targets are put
# together here from the same modules, with the padding masked as a key in every attention

class CrossBERTForMaskedLM(CrossBERTPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = None  # it reads the whole model

    def __init__(self, config):
        super().__init__(config)
        if config.masked_lm is None:
            raise ValueError("this folder holds the encoder alone (an export with --encoder_only=True, or a save of "
                             "AutoModel or of a task head, as hf/finetune.py's), which fills no mask: load the folder "
                             "hf/export.py wrote without --encoder_only")
        cfg = ModelConfig(**config.masked_lm)
        self.model = MODELS[cfg.model_type](cfg)
        self.register_buffer("vocab_map", token_map(config))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, output_hidden_states=None, output_attentions=None,
                return_dict=None, **kwargs):
        """logits (B, T, token ids) at the targets of input_ids (GPT-2 ids, B, T): what the trained model puts there;
        their softmax is sample.py's probabilities, over the ids it can fill (token_logits). Zero at other positions.
        - targets: the <mask>s; with labels (B, T), the positions whose label is not -100 (transformers' rule, which
          DataCollatorForLanguageModeling follows), whatever input_ids holds there
        - loss, with labels: training's on those targets (model.py's objective): the LM head's cross-entropy, over
          the model's ids, for BERT and CrossBERT; ELECTRA's generator's, + rtd_weight x its discriminator's on the
          replacements it samples (from torch's random generator)
        - attention_mask (B, T): 1 on tokens, 0 on padding, which no row's fills depend on
        - hidden_states: the encoder's layers (encode()) on input_ids as given"""
        no_attentions(self.config, output_attentions)
        m = self.model
        B, T = input_ids.shape
        if T > m.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {m.config.block_size}; truncate the input")
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        rows = self.vocab_map[input_ids]
        targets = real & (rows == m.config.mask_token_id if labels is None else labels != -100)
        target_pos, is_target = positions(targets)
        h = FILL[m.config.model_type](m, rows, real, targets, target_pos)        # (B, M, C)
        row_logits = m.lm_logits(h)                                               # (B, M, the model's ids)
        fills = token_logits(m, self.vocab_map, row_logits, self.config)
        logits = fills.new_zeros(B, T, fills.size(-1))
        logits[targets] = fills[is_target]  # both in row-major order: each row's targets from left to right
        loss = None
        if labels is not None:
            gold = torch.where(targets, self.vocab_map[labels.clamp(min=0)], rows)  # the text's ids, all of them
            loss = F.cross_entropy(row_logits[is_target].float(), gold.gather(1, target_pos)[is_target])
            if m.config.model_type == "electra":
                loss = loss + m.config.rtd_weight * rtd_loss(m, gold, real, targets, target_pos, row_logits)
        hidden = None
        if self.config.output_hidden_states if output_hidden_states is None else output_hidden_states:
            hidden = tuple(m.encode(rows, real, range(m.config.n_layer + 1)))
        return self.outputs(MaskedLMOutput(loss=loss, logits=logits, hidden_states=hidden), return_dict)


def rtd_loss(m, gold, real, targets, target_pos, logits):
    """ELECTRA's replaced-token detection loss (model.ELECTRA.objective) over the real tokens of gold (B, T), with
    samples of the generator's logits (B, M, ids) at the targets: as in training, they send the generator no
    gradient."""
    u = torch.rand(target_pos.shape, device=gold.device)
    replaced, _ = replace_tokens(gold, target_pos, logits.detach()[..., :m.config.mask_token_id], u)
    replaced = torch.where(targets, replaced, gold)  # a row's padded target_pos holds other positions: kept
    h, _ = m.run_encoder(replaced, torch.arange(gold.size(1), device=gold.device), real[:, None, None, :])
    rtd = m.rtd_head(h).squeeze(-1).float()
    return F.binary_cross_entropy_with_logits(rtd[real], (replaced != gold)[real].float())


def positions(where):
    """The positions (B, K) where `where` (B, T) is True, in order, each row padded to the longest row's K with
    other positions; and which of them are real (B, K)."""
    K = int(where.sum(1).max())
    pos = where.int().argsort(dim=1, descending=True, stable=True)[:, :K]
    return pos, where.gather(1, pos)


def bert_states(m, rows, real, targets, target_pos):
    """BERT's last layer at the targets: every layer reads the text with <mask> there (model.BERT.predict)."""
    h, _ = m.run_encoder(rows, torch.arange(rows.size(1), device=rows.device), real[:, None, None, :])
    return h.gather(1, target_pos[..., None].expand(-1, -1, h.size(-1)))


def crossbert_states(m, rows, real, targets, target_pos):
    """CrossBERT's predictor at the targets (model.CrossBERT.predict): the encoder sees the other tokens (the visible
    set), and the predictor's queries attend to its states. Padding is a key no query attends to."""
    if not (real & ~targets).any(1).all():
        raise ValueError("a text of <mask>s alone leaves CrossBERT's encoder nothing to see: keep some words")
    visible_pos, seen = positions(real & ~targets)
    return m.predict(rows, Views(torch.arange(len(rows), device=rows.device), visible_pos, target_pos),
                     seen[:, None, None, :])


def electra_states(m, rows, real, targets, target_pos):
    """ELECTRA's generator at the targets, back at the LM head's width (model.ELECTRA.run_generator): a narrow BERT
    that reads the text with <mask> there."""
    return m.generator_states(rows, target_pos, real[:, None, None, :])


FILL = {"bert": bert_states, "crossbert": crossbert_states, "electra": electra_states}


def token_logits(m, vocab_map, logits, config):
    """Logits over token ids (.., len(vocab_map)) of logits over the model's embedding rows (.., vocab_size), the
    rows vocab_map gives the token ids. The fills are the rows a text can hold (those below <mask>, as sample.py
    fills) and those of tokens added to the tokenizer: each at the one id (a text id below config.mask_token_id, or an
    added one) whose row it is alone; the rest (a compact vocabulary's <unk>, the row of every rare id) together at
    config.unk_token_id, by logsumexp; the other ids -inf. So their softmax is sample.py's probabilities, each fill at
    its token."""
    first = config.unk_token_id + 1
    ids = torch.cat([torch.arange(config.mask_token_id), torch.arange(first, first + config.added_tokens)])
    ids = ids.to(logits.device)
    row = vocab_map[ids]
    alone = torch.bincount(row, minlength=m.config.vocab_size)[row] == 1
    text = logits[..., :m.config.mask_token_id].float()
    rest = torch.ones(text.size(-1), dtype=torch.bool, device=logits.device)
    rest[row[alone & (row < text.size(-1))]] = False
    out = text.new_full((*text.shape[:-1], len(vocab_map)), float("-inf"))
    out[..., ids[alone]] = logits[..., row[alone]].float()
    out[..., config.unk_token_id] = text[..., rest].logsumexp(-1)
    return out
