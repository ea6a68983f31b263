"""sample.py on tiny models trained for a few hundred steps on one repeated sentence: each fills its words."""
import re
from dataclasses import asdict

import numpy as np
import pytest
import torch

import sample
from evaluation.features import load_backbone
from plumbing.checkpoint import save_checkpoint
from conftest import assert_one_line_error
from data.tokenizer import MASK, VOCAB_SIZE, compact_vocab, decode, encode, encode_masked
from model import MODELS, ModelConfig

SENTENCE = "The quick brown fox jumps over the lazy dog."  # 10 tokens, the block: every window is a rotation of it


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{model type: the path of its checkpoint}, each trained on the sentence repeated, with a compact vocabulary."""
    ids = encode(SENTENCE)
    stream = np.array(ids * 100)
    paths = {}
    for model_type in ("bert", "crossbert", "electra"):
        torch.manual_seed(0)
        config = ModelConfig(model_type=model_type, n_layer=2, n_head=2, n_embd=32, block_size=len(ids), vocab_size=64)
        model = MODELS[model_type](config)
        vocab_map = torch.from_numpy(compact_vocab(np.bincount(stream, minlength=VOCAB_SIZE), 64))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(0)
        for _ in range(200 if model_type == "crossbert" else 300):  # BERT: 80/10/10 shows <mask> at 80% of targets
            starts = torch.randint(0, len(stream) - len(ids), (8,), generator=g).tolist()
            idx = vocab_map[torch.from_numpy(np.stack([stream[s:s + len(ids)] for s in starts]))]  # as train.py reads
            loss, _ = model(idx, *model.draw(8, len(ids), generator=g))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        paths[model_type] = tmp_path_factory.mktemp(model_type) / "ckpt.pt"
        save_checkpoint(paths[model_type], {"model": model.state_dict(), "model_type": model_type,
                                            "model_args": asdict(config), "vocab_map": vocab_map})
    return paths


def run(capsys, *args):
    sample.main([*args, "--device=cpu"])
    return capsys.readouterr().out.splitlines()


def fills(line):
    """The fills of one printed "<mask> j: word p, word p, ..." line, as (word, probability) pairs."""
    return [(w, float(p)) for w, p in (f.rsplit(" ", 1) for f in line.split(": ", 1)[1].split(", "))]


@pytest.mark.parametrize("model_type", ["bert", "crossbert"])
def test_the_top_fill_of_a_masked_word_is_that_word(trained, capsys, model_type):
    out = run(capsys, f"--ckpt={trained[model_type]}", "--text=The quick brown <mask> jumps over the <mask> dog.")
    first, second = fills(out[-2]), fills(out[-1])
    assert out[-2].startswith("<mask> 1:") and [w for w, _ in first][0] == "fox", out
    assert [w for w, _ in second][0] == "lazy", out
    for f in (first, second):  # five fills, likeliest first, probabilities of a distribution
        probs = [p for _, p in f]
        assert len(f) == 5 and probs == sorted(probs, reverse=True) and 0.5 < probs[0] and sum(probs) <= 1.001


def test_electra_detects_the_replaced_word(trained, capsys):
    # its discriminator, the encoder, learns fast: nothing in the sentence looks replaced, and a word of it put where
    # another belongs does, most of all
    for text, replaced in ((SENTENCE, None), ("The quick brown fox jumps over the quick dog.", 7)):
        out = run(capsys, f"--ckpt={trained['electra']}", f"--text={text}", "--detect")
        rows = [line.split() for line in out[out.index("the discriminator's probability that each token was "
                                                       "replaced:") + 1:]]
        assert [r[1] for r in rows] == text.replace(".", " .").split()
        p = [float(r[0]) for r in rows]
        assert [q > 0.5 for q in p] == [i == replaced for i in range(10)], out


def test_views_partition_the_positions(trained, capsys):
    backbone = load_backbone(trained["crossbert"])[0]
    ids, views = sample.cut(encode(SENTENCE), backbone.config, seed=0)
    ranks = sample.show_views(backbone, ids, views, 3, str)
    out = capsys.readouterr().out.splitlines()
    seen, targets = views.visible_pos.tolist(), views.target_pos.tolist()
    assert len(seen) == 2 and sorted(seen[0] + seen[1]) == list(range(10))  # the views' visible sets partition
    assert sorted(targets[0]) == sorted(seen[1]) and sorted(targets[1]) == sorted(seen[0])  # each fills the other
    tokens = [decode([t]) for t in encode(SENTENCE)]
    for v in range(2):  # the printed view shows the tokens it sees, and blanks where the other view's are
        blanked = "".join(t if i in seen[v] else re.sub(r"\S", "_", t) for i, t in enumerate(tokens))
        assert out[1 + 6 * v] == f"view {v + 1}: sees 5 tokens: {blanked}", out
    assert len(ranks) == 10 and ranks.count(1) >= 8  # the trained model fills its sentence
    assert out[-1] == f"the top fill is the true token at {ranks.count(1)} of 10 positions; median rank 1"


def test_an_odd_length_text_is_padded_into_views(trained, capsys):
    out = run(capsys, f"--ckpt={trained['crossbert']}", "--views=The quick brown fox jumps over the lazy dog")  # 9
    assert out[1].startswith("10 tokens, 2 view(s)") and sum("<|endoftext|>" in line for line in out) == 1


def test_the_neighbours_of_a_line_include_itself_first(trained, capsys, tmp_path):
    lines = [f"{a} {b} jumps over the {c}." for a in ("The fox", "A dog", "The cat") for b in ("quick", "lazy")
             for c in ("dog", "fox", "moon")]
    (tmp_path / "lines.txt").write_text("\n".join(lines[:5] + [""] + lines[5:]) + "\n")  # a blank line is skipped
    for model_type in ("crossbert", "electra"):
        out = run(capsys, f"--ckpt={trained[model_type]}", f"--neighbours={tmp_path / 'lines.txt'}",
                  f"--query={lines[7]}", "--top_k=3")
        assert f"({len(lines)} texts)" in out[1]
        hits = [line.split(maxsplit=3) for line in out[2:]]
        assert len(hits) == 3 and hits[0][1:] == ["line", "9:", lines[7]]  # line 9 of the file: after the blank
        scores = [float(h[0]) for h in hits]
        assert scores[0] == pytest.approx(1.0, abs=1e-3) and scores == sorted(scores, reverse=True)
        assert len({h[2] for h in hits}) == 3  # three different lines


def test_a_mask_takes_the_spaces_before_it():
    # GPT-2's tokens carry their leading space: the fill of "a <mask>" is " time", so the space is not a token of its own
    assert encode_masked("Once upon a <mask>, <mask>.") == encode("Once upon a") + [MASK] + encode(",") + [MASK] + \
        encode(".")
    assert encode_masked("a <pad> <|endoftext|>") == encode("a <pad> <|endoftext|>")  # only <mask> is special


def test_bad_input_ends_in_one_line(trained, tmp_path, capsys):
    ckpt = f"--ckpt={trained['crossbert']}"
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    for args, needle in [
        ([ckpt, "--text=The quick brown fox."], "--text has no <mask>: put <mask> where a word should be filled"),
        ([ckpt, "--text=<mask> <mask>"], "--text is all <mask>"),
        ([ckpt, "--text=" + "a <mask> " * 20], "longer than the checkpoint's block of 10: shorten it"),
        ([ckpt, "--views=" + " ".join(["word"] * 11)], "--views is 11 tokens, longer than the checkpoint's block of 10"),
        ([f"--ckpt={trained['bert']}", "--views=fox"], "--views is 1 tokens, too short to mask 0.2 of it"),
        ([ckpt, f"--neighbours={tmp_path / 'empty.txt'}", "--query=a fox"], "no text in it"),
        ([ckpt, f"--neighbours={tmp_path / 'nope.txt'}", "--query=a fox"], f"--neighbours={tmp_path / 'nope.txt'}: no such file"),
        ([ckpt, "--query=a fox"], "--neighbours=FILE and --query=TEXT go together"),
        ([ckpt], "pass one of --text=..., --views=... or --neighbours=FILE --query=..."),
        ([ckpt, "--text=a <mask>", "--views=a b"], "pass one of"),
        ([ckpt, "--text=The fox.", "--detect"], "holds a crossbert model: pass an ELECTRA checkpoint"),
        ([ckpt, "--text=a <mask>", "--top_k=0"], "--top_k=0: must be at least 1"),
        ([f"--ckpt={tmp_path / 'notes.txt'}", "--text=a <mask>"], "not a checkpoint written by train.py"),
        ([f"--ckpt={tmp_path / 'none.pt'}", "--text=a <mask>"], "no such checkpoint"),
    ]:
        assert_one_line_error(sample.main, args + ["--device=cpu"], "sample.py", needle)
        assert capsys.readouterr().out == ""  # and nothing else is printed
