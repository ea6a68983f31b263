"""The compact vocabulary: a map from GPT-2 ids to a small head for small models, applied to the data (the trainer's
batches, the evaluators' Backbone) and kept in the checkpoint beside the weights."""
import numpy as np
import pytest
import torch

from data.tokenizer import EOT, MASK, PAD, VOCAB_SIZE, compact_vocab
from evaluation.features import Backbone
from model import MODELS, ModelConfig


def test_compact_vocab_keeps_the_most_frequent_ids():
    counts = np.zeros(VOCAB_SIZE, np.int64)
    counts[[5, 7, 9, EOT, 11]] = [10, 30, 20, 25, 1]
    m = compact_vocab(counts, 7)  # 4 kept ids + <unk>, <mask>, <pad>
    assert [m[i] for i in (7, EOT, 9, 5)] == [0, 1, 2, 3]  # most frequent first
    assert m[11] == m[0] == m[50000] == 4  # everything else is <unk>
    assert (m[MASK], m[PAD]) == (5, 6) and m.max() == 6
    with pytest.raises(ValueError, match="4 to"):
        compact_vocab(counts, 3)


@pytest.mark.parametrize("model_type", ["bert", "crossbert"])
def test_the_map_lives_outside_the_model(model_type):
    counts = np.arange(VOCAB_SIZE)[::-1].copy()  # ids 0..60 are the most frequent
    torch.manual_seed(0)
    model = MODELS[model_type](ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=32, block_size=16,
                                           vocab_size=64)).eval()
    assert model.wte.weight.shape == (64, 32) and not [k for k in model.state_dict() if "vocab" in k]
    # <mask> is GPT-2's id, or the compact layout's vocab_size - 2
    assert ModelConfig().mask_token_id == 50257 and ModelConfig(vocab_size=64).mask_token_id == 62
    # a model built directly reads its own ids, and refuses others rather than mapping them silently
    with pytest.raises(IndexError):
        model.encode(torch.full((1, 16), 30000))
    # the evaluators read GPT-2 ids through the checkpoint's map: two different rare ids are the same <unk>
    backbone = Backbone(model, torch.from_numpy(compact_vocab(counts, 64)))
    idx = torch.randint(0, 61, (2, 16))
    rare = idx.clone()
    rare[:, 3] = 30000
    other = rare.clone()
    other[:, 3] = 40000
    with torch.no_grad():
        assert torch.equal(backbone.encode(rare), backbone.encode(other))
        assert not torch.equal(backbone.encode(idx), backbone.encode(rare))
        assert torch.equal(backbone.encode(idx), model.encode(backbone.ids(idx)))
        assert torch.equal(backbone.ids(torch.tensor([MASK, PAD])), torch.tensor([62, 63]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention is a CUDA kernel")
@pytest.mark.parametrize("model_type", ["bert", "crossbert"])
def test_flash_serves_training_and_encode(model_type):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model = MODELS[model_type](ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=128,
                                           block_size=128)).cuda()
    idx = torch.randint(0, 50257, (4, 128), device="cuda")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        model(idx)[0].backward()  # raises if the flash kernel cannot serve an attention call
        with torch.no_grad():
            assert model.encode(idx).shape == (4, 128, 128)
