"""The compact vocabulary: a map from GPT-2 ids to a small head for small models, saved with the weights."""
import numpy as np
import pytest
import torch

from data.tokenizer import EOT, MASK, PAD, VOCAB_SIZE, compact_vocab
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
def test_model_reads_gpt2_ids_through_the_map(model_type):
    counts = np.arange(VOCAB_SIZE)[::-1].copy()  # ids 0..60 are the most frequent
    torch.manual_seed(0)
    model = MODELS[model_type](ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                                           mask_token_id=62)).eval()
    model.vocab_map.copy_(torch.from_numpy(compact_vocab(counts, 64)))
    assert model.wte.weight.shape == (64, 32) and "vocab_map" in model.state_dict()
    # <mask> defaults to GPT-2's id, or to the compact layout's vocab_size - 2
    assert ModelConfig().mask_token_id == 50257 and ModelConfig(vocab_size=64).mask_token_id == 62
    idx = torch.randint(0, 61, (2, 16))
    rare = idx.clone()
    rare[:, 3] = 30000  # two different rare ids read as the same <unk>
    other = rare.clone()
    other[:, 3] = 40000
    with torch.no_grad():
        assert torch.equal(model.encode(rare), model.encode(other))
        assert not torch.equal(model.encode(idx), model.encode(rare))
        views, = model.draw(*idx.shape)
        logits = torch.nn.functional.linear(model.predict(model.vocab_ids(idx)[views.rows], views), model.wte.weight)
        loss, _ = model(idx, views)
    assert logits.shape[-1] == 64 and torch.isfinite(loss)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlashAttention is a CUDA kernel")
@pytest.mark.parametrize("model_type", ["bert", "crossbert"])
def test_flash_serves_training_and_encode(model_type):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model = MODELS[model_type](ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=128, block_size=128)).cuda()
    idx = torch.randint(0, 50257, (4, 128), device="cuda")
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        model(idx)[0].backward()  # raises if the flash kernel cannot serve an attention call
        with torch.no_grad():
            assert model.encode(idx).shape == (4, 128, 128)
