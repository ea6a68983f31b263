"""
The exported model in HF transformers. export.py writes this file beside the weights, with copies of model.py,
masking.py and the poolers (poolers.py: embeddings/vectors.py's), so that

    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    out = AutoModel.from_pretrained(folder, trust_remote_code=True)(**batch)
    out.last_hidden_state   # (B, T, C): model.py's encode(), the encoder's last layer (padding ignored)
    out.pooler_output       # (B, C): embed.py's unit-norm sentence embedding (the exported pooler, or mean pooling)
    AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)(**batch).logits   # the fills of its <mask>s
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
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutputWithPooling, MaskedLMOutput, SequenceClassifierOutput,
                                           TokenClassifierOutput)

from .masking import Views
from .model import BERT, MODELS, MaskedLM, ModelConfig, rope_tables
from .poolers import POOLERS, mean_pool


class CrossBERTEncoderConfig(PretrainedConfig):
    model_type = "crossbert_encoder"

    def __init__(self, encoder=None, masked_lm=None, pooler=None, trained_as=None, **kwargs):
        self.encoder = encoder or {}    # model.ModelConfig's fields, of the BERT whose LM head is dropped
        self.masked_lm = masked_lm      # the trained model's ModelConfig fields, where the export holds what fills
                                        # masks; None: the encoder alone
        self.pooler = pooler            # None (mean pooling), or one of POOLERS: {"kind", "n_embd", "n_head"}
        self.trained_as = trained_as    # the family that trained the encoder: bert, crossbert or electra
        super().__init__(**kwargs)


class CrossBERTPreTrainedModel(PreTrainedModel):
    config_class = CrossBERTEncoderConfig
    base_model_prefix = "crossbert"
    # an export holds the filling part beside the encoder (LM head, predictor or generator): the encoder's classes
    # leave it unread, without a warning
    _keys_to_ignore_on_load_unexpected = [r"^model\.(?!(wte|ln_e|blocks|ln_f)\.)"]
    accepts_loss_kwargs = False  # the losses are batch means: the Trainer scales them for gradient accumulation

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


def token_map(config):
    """A stand-in for the map from GPT-2 token ids to the model's (config.vocab_size,): the same ids. The map is a
    buffer saved with the weights, which replace it."""
    return torch.arange(config.vocab_size)


class CrossBERTEncoderModel(CrossBERTPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = BERT(ModelConfig(**config.encoder))
        self.model.head = self.model.decoder_bias = None  # the LM head: encode() never reads it, nor a task head
        self.register_buffer("vocab_map", token_map(config))
        p = config.pooler
        self.pooler = POOLERS[p["kind"]](p["n_embd"], p["n_head"]) if p else None
        self.post_init()

    def encode(self, input_ids, attention_mask=None):
        """model.encode()'s states (B, T, C) of GPT-2 token ids (B, T), mapped to the model's ids first."""
        return self.model.encode(self.vocab_map[input_ids], attention_mask)

    def pool(self, input_ids, attention_mask=None):
        """The encoder's states (B, T, C) of GPT-2 token ids (B, T), and their pooling (B, C), the export's pooler or
        mean pooling, over the real tokens (attention_mask (B, T): 1 on tokens, 0 on padding)."""
        h = self.encode(input_ids, attention_mask)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        return h, mean_pool(h, mask) if self.pooler is None else self.pooler(h, mask)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        h, pooled = self.pool(input_ids, attention_mask)
        return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=F.normalize(pooled.float(), dim=-1))


# ----------------------------------------------------------------------------
# Task heads for fine-tuning, with transformers' conventions: labels, num_labels, problem_type; frozen or not is the
# user's choice (requires_grad on model.base_model's parameters)

class LinearHead(CrossBERTPreTrainedModel):
    """The exported encoder and a linear classifier on its states (what the task heads below share)."""

    def __init__(self, config):
        super().__init__(config)
        self.crossbert = CrossBERTEncoderModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()


class CrossBERTForSequenceClassification(LinearHead):
    """A linear head on the export's pooling of the encoder's states: classification, or regression for num_labels=1."""

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        logits = self.classifier(self.crossbert.pool(input_ids, attention_mask)[1])
        return SequenceClassifierOutput(loss=None if labels is None else sequence_loss(self.config, logits, labels),
                                        logits=logits)


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

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        logits = self.classifier(self.crossbert.encode(input_ids, attention_mask))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)


# ----------------------------------------------------------------------------
# Filling masks: each family the way it trained, as sample.py shows it (model.fill), on a padded batch. model.py's
# predict() and run_generator() run fixed windows without an attention mask, so the states at the targets are put
# together here from the same modules, with the padding masked as a key in every attention

class CrossBERTForMaskedLM(CrossBERTPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = None  # it reads the whole model

    def __init__(self, config):
        super().__init__(config)
        if config.masked_lm is None:
            raise ValueError("this export holds the encoder alone (exported with --encoder_only=True), which fills no "
                             "mask: export the checkpoint again without --encoder_only to fill masks")
        cfg = ModelConfig(**config.masked_lm)
        self.model = MODELS[cfg.model_type](cfg)
        self.register_buffer("vocab_map", token_map(config))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """logits (B, T, token ids) at the <mask>s of input_ids (GPT-2 ids, B, T): what the trained model puts there;
        their softmax is sample.py's probabilities, over the ids it can fill (token_logits). Zero at other positions.
        attention_mask (B, T): 1 on tokens, 0 on padding, which no row's fills depend on."""
        m = self.model
        B, T = input_ids.shape
        if T > m.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {m.config.block_size}; truncate the input")
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        rows = self.vocab_map[input_ids]
        targets = real & (rows == m.config.mask_token_id)
        target_pos, is_target = positions(targets)
        h = FILL[m.config.model_type](m, rows, real, targets, target_pos)        # (B, M, C)
        fills = token_logits(m, self.vocab_map, m.lm_logits(h), self.config.mask_token_id, self.config.unk_token_id)
        logits = fills.new_zeros(B, T, fills.size(-1))
        logits[targets] = fills[is_target]  # both in row-major order: each row's <mask>s from left to right
        return MaskedLMOutput(logits=logits)


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
    visible_pos, seen = positions(real & ~targets)
    if not seen[:, 0].all():
        raise ValueError("a text of <mask>s alone leaves CrossBERT's encoder nothing to see: keep some words")
    return m.predict(rows, Views(torch.arange(len(rows), device=rows.device), visible_pos, target_pos),
                     seen[:, None, None, :])


def electra_states(m, rows, real, targets, target_pos):
    """ELECTRA's generator at the targets, back at the LM head's width (model.ELECTRA.run_generator): a narrow BERT
    that reads the text with <mask> there."""
    return m.generator_states(rows, target_pos, real[:, None, None, :])


FILL = {"bert": bert_states, "crossbert": crossbert_states, "electra": electra_states}


def token_logits(m, vocab_map, logits, n_text, unk):
    """Logits over token ids (.., len(vocab_map)) of logits over the model's embedding rows (.., vocab_size), the
    rows vocab_map gives the token ids. The fills are the rows a text can hold (those below <mask>, as sample.py
    fills): each at the one text id (below n_text) whose row it is alone; the rest (a compact vocabulary's <unk>, the
    row of every rare id) together at the token id unk, by logsumexp; the other ids -inf. So their softmax is
    sample.py's probabilities, each fill at its token."""
    text = logits[..., :m.config.mask_token_id].float()
    ids = torch.arange(n_text, device=logits.device)
    row = vocab_map[:n_text]  # each text id's row
    alone = torch.bincount(row, minlength=m.config.vocab_size)[row] == 1
    rest = torch.ones(text.size(-1), dtype=torch.bool, device=logits.device)
    rest[row[alone]] = False
    out = text.new_full((*text.shape[:-1], len(vocab_map)), float("-inf"))
    out[..., ids[alone]] = text[..., row[alone]]
    out[..., unk] = text[..., rest].logsumexp(-1)
    return out
