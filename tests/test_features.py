import numpy as np
import torch

import features
from data.tokenizer import EOT, PAD, encode
from model import CrossBERT, ModelConfig


class Recorder(torch.nn.Module):
    """Stand-in encoder: a token's state is its id (in every channel); it records the inputs it sees."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.seen, self.masked, self.modes = [], [], []

    def encode(self, idx, attention_mask=None, layers=None):
        mask = torch.ones_like(idx, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.seen += [row[m].tolist() for row, m in zip(idx, mask)]
        self.masked.append(attention_mask is not None)
        self.modes.append(self.training)
        assert (idx[~mask] == PAD).all()
        return [idx.float()[..., None].expand(-1, -1, 3) * layer for layer in layers]


def test_pair_features_come_from_the_joint_encoding():
    texts = [("A man is playing.", "Someone plays a flute loudly tonight."), ("Hi", "there"), ("Dogs bark at night.", "")]
    ids, n_truncated = features.tokenize(texts, block_size=64)
    joint = [encode(a) + [EOT] + encode(b) for a, b in texts]
    assert ids == joint and n_truncated == 0
    model = Recorder()
    feats = features.features(model, ids, layers=[1, 2], batch_size=2)
    assert sorted(model.seen) == sorted(joint)  # batches sorted by length, padded with PAD, masked
    assert model.masked == [True, False]  # lengths 3 and 6 share a padded batch; the longest runs alone, unmasked
    for i, x in enumerate(joint):  # back in input order, mean over real tokens only
        np.testing.assert_allclose(feats[1][i], np.mean(x), rtol=1e-6)
        np.testing.assert_allclose(feats[2][i], 2 * np.mean(x), rtol=1e-6)


def test_truncation_keeps_both_sides_and_counts():
    a, b = "word " * 50, "other " * 5
    room = 15 - len(encode(b))  # 16 minus EOT minus b: the short side is kept whole
    ids, n = features.tokenize([(a, b), ("short", "pair"), (b, a)], block_size=16)
    assert n == 2 and [len(x) for x in ids] == [16, 3, 16]
    assert ids[0] == encode(a)[:room] + [EOT] + encode(b)  # the longer side is trimmed first
    assert ids[2] == encode(b) + [EOT] + encode(a)[:room]
    assert features.tokenize([(a,), ("short",)], 16) == ([encode(a)[:16], encode("short")], 1)
    assert features.tokenize([("",)], 16)[0] == [[EOT]]  # an empty text still has a token to average


def test_batched_features_equal_one_at_a_time():
    torch.manual_seed(0)
    model = CrossBERT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)).train()
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 50000, n).tolist() for n in (5, 9, 9, 17, 3, 9, 30)]
    batched = features.features(model, ids, layers=[1, 2], batch_size=4)  # padded and unpadded batches
    alone = features.features(model, ids, layers=[1, 2], batch_size=1)    # never padded
    for layer in (1, 2):
        np.testing.assert_allclose(batched[layer], alone[layer], rtol=1e-4, atol=1e-5)
    assert model.training  # dropout is off while features are taken, and the mode is handed back


def test_progress_in_a_log_is_plain_lines(capsys):
    model = Recorder().train()
    features.features(model, [[i + 1] for i in range(25)], layers=[1], batch_size=1, desc="SST-2 dev")
    err = capsys.readouterr().err  # not a terminal under pytest: a line per 10%, no carriage returns
    assert "\r" not in err and err.splitlines() == [f"SST-2 dev: {i}/25 batches" for i in (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)]
    assert model.modes == [False] * 25 and model.training
