"""
The exported encoder in HF transformers. export.py writes this file beside the weights, with copies of model.py and
masking.py, so that

    from transformers import AutoModel, AutoTokenizer
    model = AutoModel.from_pretrained(folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt"))
    out.last_hidden_state   # (B, T, C): model.py's encode(), the encoder's last layer (padding ignored)
    out.pooler_output       # (B, C): embed.py's unit-norm sentence embedding (the exported pooler, or mean pooling)

runs the very model.py the encoder was trained with, not a second implementation of it. Every family's encoder (BERT's
layers, CrossBERT's encoder, ELECTRA's discriminator) is model.py's shared stack: the token embedding (with the
compact vocabulary's map), the blocks and the final norm. A BERT without its LM head is exactly that stack, so that is
what is built here; the LM head, CrossBERT's predictor and ELECTRA's generator are not exported.
"""
import torch
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .model import BERT, POOLERS, MaskedLM, ModelConfig, mean_pool, rope_tables


class CrossBERTEncoderConfig(PretrainedConfig):
    model_type = "crossbert_encoder"

    def __init__(self, encoder=None, pooler=None, trained_as=None, **kwargs):
        self.encoder = encoder or {}    # model.ModelConfig's fields, of a BERT without the LM head
        self.pooler = pooler            # None (mean pooling), or model.py's POOLERS: {"kind", "n_embd", "n_head"}
        self.trained_as = trained_as    # the family that trained the encoder: bert, crossbert or electra
        super().__init__(**kwargs)


class CrossBERTEncoderModel(PreTrainedModel):
    config_class = CrossBERTEncoderConfig
    base_model_prefix = "crossbert"

    def __init__(self, config):
        super().__init__(config)
        self.encoder = BERT(ModelConfig(**config.encoder))
        p = config.pooler
        self.pooler = POOLERS[p["kind"]](p["n_embd"], p["n_head"]) if p else None
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        # model.py initialises the weights itself, and model.safetensors replaces them all; but transformers builds
        # the model without memory first, so the rotary tables (computed, never saved) are computed here again
        if isinstance(module, MaskedLM):
            cos, sin = rope_tables(module.config)
            module.cos.copy_(cos)
            module.sin.copy_(sin)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        """input_ids (B, T): GPT-2 token ids (the model maps them to its compact vocabulary itself); attention_mask
        (B, T): 1 on real tokens, 0 on padding."""
        h = self.encoder.encode(input_ids, attention_mask)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        pooled = mean_pool(h, mask) if self.pooler is None else self.pooler(h, mask)
        return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=F.normalize(pooled.float(), dim=-1))
