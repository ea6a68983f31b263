import math

import numpy as np
import pytest
import torch

from evaluation import features
from data.tokenizer import EOT, PAD, encode
from configurator import UserError
from embeddings.vectors import search, zero_shot_sts
from evaluation.metrics import accuracy, f1, macro_f1, matthews, pearson, ranks, spearman
from model import CrossBERT, ModelConfig


def test_model_settings_take_modelconfigs_defaults():
    default = ModelConfig()
    assert {k: features.MODEL_SETTINGS[k] for k in ("model_type", "n_layer", "n_head", "n_embd", "block_size")} == {
        k: getattr(default, k) for k in ("model_type", "n_layer", "n_head", "n_embd", "block_size")}


@pytest.mark.parametrize("changes, message", [
    (dict(device="tpu"), "--device='tpu': expected cpu or cuda[:N]"),
    (dict(model_type="gpt"), "--model_type='gpt': expected one of bert, crossbert, electra"),
    (dict(like="out/ckpt.pt"), "--like=out/ckpt.pt makes a random twin: pass it with --ckpt=random"),
    (dict(ckpt="random", n_embd=64, n_head=3), "n_embd=64 must split into n_head=3 heads"),
])
def test_model_settings_are_checked_before_anything_is_read(changes, message):
    with pytest.raises(UserError) as e:
        features.check_model_settings({**features.MODEL_SETTINGS, "device": "cpu", "ckpt": "no/such/ckpt.pt", **changes})
    assert message in str(e.value)
    features.check_model_settings(dict(features.MODEL_SETTINGS, device="cpu"))  # the defaults pass


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


# ---------------------------------------------------------------- metrics

def test_metrics_by_hand():
    pred, gold = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 0, 1])
    assert accuracy(pred, gold) == pytest.approx(0.8)
    assert f1(pred, gold) == pytest.approx(0.8)  # tp 2, fp 1, fn 0: 4 / 5
    assert matthews(pred, gold) == pytest.approx(4 / 6)  # (2*2 - 1*0) / sqrt(3*2*3*2)
    assert matthews(np.ones(4), np.array([1, 0, 1, 0])) == 0.0  # predicted class 0 missing
    assert matthews(np.array([1, 0, 1, 0]), np.zeros(4)) == 0.0  # gold class 1 missing
    assert f1(np.zeros(3), np.array([1, 0, 0])) == 0.0
    # 3 classes: per-class F1 1, 2/3, 0 -> mean 5/9
    assert macro_f1(np.array([0, 1, 1, 0]), np.array([0, 1, 2, 0])) == pytest.approx(5 / 9)
    assert pearson(np.array([1.0, 2, 3]), np.array([2.0, 4, 7])) == pytest.approx(5 / math.sqrt(2 * 38 / 3))
    assert pearson(np.ones(3), np.arange(3.0)) == 0.0


def test_spearman_with_ties():
    assert ranks(np.array([10, 20, 20, 30, 20])).tolist() == [1, 3, 3, 5, 3]
    # ranks x: 1, 2.5, 2.5, 4; y: 1, 3, 2, 4 -> covariance 4.5 / sqrt(4.5 * 5)
    assert spearman(np.array([1, 2, 2, 3]), np.array([1, 3, 2, 4])) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman(np.array([3.0, 1, 2]), np.array([30.0, 10, 20])) == pytest.approx(1.0)


def test_spearman_with_ties_matches_hand_computation():
    x, y = [1.0, 2.0, 2.0, 3.0, 5.0], [2.0, 1.0, 4.0, 4.0, 3.0]
    rx, ry = [1, 2.5, 2.5, 4, 5], [2, 1, 4.5, 4.5, 3]  # tied values share their average rank
    mx, my = sum(rx) / 5, sum(ry) / 5
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    expected = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert spearman(np.array(x), np.array(y)) == pytest.approx(expected)


# ---------------------------------------------------------------- embeddings

def test_search_is_exact_top_k_and_skips_own_id():
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(7, 8), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(50, 8), dim=-1)
    exclude = torch.tensor([-1, 3, -1, 49, 0, -1, 20])
    got = search(q, d, 5, exclude, q_chunk=3, d_chunk=8)  # chunks smaller than the data
    sim = q @ d.T
    for i in range(7):
        if exclude[i] >= 0:
            sim[i, exclude[i]] = -math.inf
    assert torch.equal(got, sim.topk(5, dim=1).indices)


def test_zero_shot_sts_is_the_spearman_of_mean_pooled_cosines(tmp_path):
    rows = [(4.5, "A cat sits on the mat.", "A cat is sitting on a mat."), (0.5, "A dog runs.", "Stocks fell sharply today."),
            (3.0, "He ate rice.", "He ate some food."), (2.0, "Rain is falling.", "The sun is out.")]
    (tmp_path / "sts.tsv").write_text("".join(f"{y}\t{a}\t{b}\n" for y, a, b in rows))
    torch.manual_seed(0)
    model = CrossBERT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)).train()
    with torch.no_grad():
        model.eval()
        mean = lambda s: model.encode(torch.tensor([encode(s)]))[0].mean(0)
        cos = [torch.cosine_similarity(mean(a), mean(b), dim=0).item() for _, a, b in rows]
        model.train()
    order = lambda x: np.argsort(np.argsort(x))  # ranks, with no ties here
    expected = 100 * np.corrcoef(order(cos), order([y for y, _, _ in rows]))[0, 1]
    assert zero_shot_sts(model, tmp_path / "sts.tsv") == pytest.approx(expected, abs=1e-6)
    assert model.training  # train.py calls it mid-run: the mode is handed back
    (tmp_path / "more.tsv").write_text("1\ta\tb\n")
    with pytest.raises(ValueError, match="holds 2 STS sets .*pass one of them"):
        zero_shot_sts(model, tmp_path)
