import concurrent.futures
import gzip
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from conftest import script_error
from data import corpus
from data.corpus import read_files, write_bins
from data.loader import TokenWindows
from data.tokenizer import EOT, MASK, PAD, RANKS_PATH, VOCAB_SIZE, decode, encode, encode_batch, get_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEP = "<|endoftext|>"


# ---- tokenizer


def test_tokenizer_round_trip_and_known_ids():
    text = "Hello world! Ünïcödé, emoji 🙂, tabs\tand\nnewlines; <mask> and <|endoftext|> stay text."
    ids = encode(text)
    assert decode(ids) == text
    assert EOT not in ids and MASK not in ids  # special tokens' spellings in text are ordinary text
    assert encode("Hello world") == [15496, 995]  # GPT-2's own ids
    assert encode_batch(["a cat", "", text]) == [encode("a cat"), [], ids]


def test_special_token_ids():
    enc = get_tokenizer()
    assert (EOT, MASK, PAD, VOCAB_SIZE) == (50256, 50257, 50258, 50304)
    assert enc.encode(SEP + "<mask><pad>", allowed_special="all") == [EOT, MASK, PAD]
    assert decode([EOT, MASK, PAD]) == SEP + "<mask><pad>"
    assert enc.n_vocab == 50259 and VOCAB_SIZE % 64 == 0


def test_corrupted_or_missing_ranks_file(tmp_path):
    data = bytearray(open(RANKS_PATH, "rb").read())
    data[100] ^= 1
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(data)
    with pytest.raises(ValueError, match="corrupted: sha256 .*git checkout data/gpt2.tiktoken"):
        get_tokenizer(str(bad))
    with pytest.raises(FileNotFoundError, match="missing"):
        get_tokenizer(str(tmp_path / "nope.tiktoken"))


# ---- prepare


def make_corpus(folder):
    """Documents in every supported format; returns them in the order prepare reads them (sorted paths)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.txt").write_text("First file.\r\nWindows line ends and ünicode survive.\n", encoding="utf-8")
    rows = [json.dumps({"text": "Row one of b."}), "", json.dumps({"text": "Row two."})]  # blank lines are skipped
    (folder / "b.jsonl").write_text("\n".join(rows) + "\n")
    with gzip.open(folder / "c.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "Gzipped <|endoftext|> spelled out.", "id": 3}) + "\n")
    pq.write_table(pa.table({"text": ["Parquet one.", "Parquet two."]}), folder / "d.parquet")
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "e.txt").write_text("Nested folder, last document.")
    (folder / "notes.md").write_text("not a supported extension: skipped inside a folder")
    return ["First file.\r\nWindows line ends and ünicode survive.\n", "Row one of b.", "Row two.",
            "Gzipped <|endoftext|> spelled out.", "Parquet one.", "Parquet two.", "Nested folder, last document."]


def read_bin(path):
    return np.fromfile(path, dtype=np.uint16)


def test_prepare_local_round_trip(tmp_path):
    docs = make_corpus(tmp_path / "in")
    out = tmp_path / "out"
    meta = write_bins(read_files(str(tmp_path / "in")), str(out), "test", val_every=3, threads=2)
    train, val = read_bin(out / "train.bin"), read_bin(out / "val.bin")
    # every 3rd document (index 2, 5) is val; each document is followed by <|endoftext|>
    assert decode(train) == "".join(d + SEP for i, d in enumerate(docs) if i % 3 != 2)
    assert decode(val) == "".join(d + SEP for i, d in enumerate(docs) if i % 3 == 2)
    assert (train == EOT).sum() == 5 and (val == EOT).sum() == 2  # the spelled-out separator stayed text
    assert meta == json.loads((out / "meta.json").read_text())
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    assert (meta["train_docs"], meta["val_docs"]) == (5, 2)
    assert sorted(os.listdir(out)) == ["meta.json", "train.bin", "val.bin"]  # no temp files left


def test_prepare_token_budget_stops_at_document_boundary(tmp_path):
    docs = [f"Document number {i} says something." for i in range(50)]
    per_doc = len(encode(docs[0])) + 1
    meta = write_bins(iter(docs), str(tmp_path), "list", val_every=2, max_tokens=10 * per_doc + 1, threads=2)
    assert meta["train_docs"] + meta["val_docs"] == 11  # the first document past the budget is the last one
    assert decode(read_bin(tmp_path / "val.bin")) == "".join(d + SEP for d in docs[1:11:2])


def test_two_writers_of_one_folder_both_finish(tmp_path):
    """Two sweeps that prepare the same corpus at once: the first stalls after its first document while the second
    writes the whole folder; each keeps its own temp files, so both finish with the same files."""
    docs = [f"Document number {i} says something." for i in range(6)]
    first_reading, second_done = threading.Event(), threading.Event()

    def stalling():
        first_reading.set()  # its temp files are open: they are opened before the first document is read
        yield docs[0]
        assert second_done.wait(30)
        yield from docs[1:]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(write_bins, stalling(), str(tmp_path), "t", val_every=3, threads=1)
        assert first_reading.wait(30)
        second = write_bins(iter(docs), str(tmp_path), "t", val_every=3, threads=1)
        second_done.set()
        assert first.result(timeout=30) == second
    assert decode(read_bin(tmp_path / "train.bin")) == "".join(d + SEP for i, d in enumerate(docs) if i % 3 != 2)
    assert sorted(os.listdir(tmp_path)) == ["meta.json", "train.bin", "val.bin"]


def test_prepare_lone_surrogate_becomes_replacement_char(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "bad \\ud800 half"}\n{"text": "fine"}\n')  # JSON can hold one
    write_bins(read_files(str(tmp_path / "in.jsonl")), str(tmp_path), "t", val_every=2, threads=2)
    assert decode(read_bin(tmp_path / "train.bin")) == "bad \ufffd half" + SEP


def test_prepare_command_line(tmp_path):
    docs = make_corpus(tmp_path / "in")
    r = subprocess.run([sys.executable, "data/local/prepare.py", f"--input={tmp_path / 'in' / '*.jsonl'}",
                        f"--out_dir={tmp_path / 'out'}", "--val_every=2"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "train" in r.stdout and "tokens/s" in r.stdout
    # the glob matched b.jsonl alone (not c.jsonl.gz): its first row is train, its second val
    assert decode(read_bin(tmp_path / "out" / "train.bin")) == docs[1] + SEP
    assert decode(read_bin(tmp_path / "out" / "val.bin")) == docs[2] + SEP
    # a parquet file without the text column: one line that names the file, its columns and --text_key, no files
    r = subprocess.run([sys.executable, "data/local/prepare.py", f"--input={tmp_path / 'in' / '*.parquet'}",
                        f"--out_dir={tmp_path / 'out2'}", "--text_key=body"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "d.parquet has no column 'body' (its columns: text); pass --text_key=" in r.stderr
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("script,begins,setting,comment", [
    ("data/local/prepare.py", "Tokenise your own text", "--val_every=100", "every Nth document goes to val.bin"),
    ("data/fineweb_edu/prepare.py", "FineWeb-Edu", "--name=sample-10BT", "the dataset's config"),
    ("data/dclm/prepare.py", "DCLM-baseline", "--max_tokens=1000000000", "a token budget"),
    ("data/tinybooks/prepare.py", "tinybooks", "--out_dir=", "where train.bin, val.bin and meta.json go"),
])
def test_prepare_help_lists_the_settings(script, begins, setting, comment):
    """--help: the script's docstring, then the settings with its own defaults and the comments in data/corpus.py."""
    r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(begins), r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.strip().startswith(setting))
    assert comment in row


@pytest.mark.parametrize("args,message", [
    ([], "pass --input= a folder, file or glob"),
    (["--input={w}/in", "--val_every=often"], "--val_every=often: val_every must be a int"),
    (["--input={w}/in", "--max_tokens=0"], "--max_tokens=0: must be at least 1 (leave it out for no budget)"),
    (["--input={w}/in", "--out_dir"], "--out_dir: expected --key=value"),
])
def test_prepare_bad_settings_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    make_corpus(tmp_path / "in")
    args = [a.replace("{w}", str(tmp_path)) for a in args]
    assert message in script_error(monkeypatch, capsys, "data/local/prepare.py", f"--out_dir={tmp_path / 'out'}", *args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing", "empty", "binary", "invalid utf-8", "bad json", "no text field",
                                  "parquet without the text column", "unsupported file", "too few documents", "val_every 1"])
def test_prepare_bad_input(tmp_path, case):
    src = tmp_path / "in"
    make_corpus(src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.bin").write_bytes(b"old!")  # an earlier good file must survive a failed run untouched
    input, error, match, val_every = str(src), ValueError, None, 2
    if case == "missing":
        input, error, match = str(tmp_path / "nothing_here"), FileNotFoundError, "no input files at .*--input="
    elif case == "empty":
        input, match = str(tmp_path / "empty"), "no text in"
        os.makedirs(input)
        (tmp_path / "empty" / "blank.txt").write_text("")
    elif case == "binary":
        (src / "z.txt").write_bytes(b"GIF89a\x00\x01\x02binary")
        match = r"z.txt: .*NUL bytes.*remove it from --input"
    elif case == "invalid utf-8":
        (src / "z.txt").write_bytes(b"caf\xe9 latin-1")
        match = r"z.txt:1: not UTF-8 text \(byte 0xe9 at column 4\); save the file as UTF-8, or remove it from --input"
    elif case == "bad json":
        (src / "z.jsonl").write_text('{"text": "ok"}\nnot json\n')
        match = r"z.jsonl, line 2: JSONDecodeError\(.Expecting value"
    elif case == "no text field":
        (src / "z.jsonl").write_text('{"body": "ok"}\n')
        match = r"z.jsonl, line 1: KeyError\('text'\).*--text_key"
    elif case == "parquet without the text column":
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"id": [1], "body": ["ok"]}), src / "z.parquet")
        match = r"z.parquet has no column 'text' \(its columns: id, body\); pass --text_key="
    elif case == "unsupported file":
        input, match = str(src / "notes.md"), "unsupported file type"
    elif case == "too few documents":
        input, match = str(src / "a.txt"), "validation split would be empty; pass a smaller --val_every"
    elif case == "val_every 1":
        val_every, match = 1, "no training documents; pass 2 or more"
    with pytest.raises(error, match=match):
        write_bins(read_files(input), str(out), input, val_every=val_every, threads=2)
    assert sorted(os.listdir(out)) == ["train.bin"] and (out / "train.bin").read_bytes() == b"old!"


def test_hub_unreachable_points_to_local_files(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hub")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError, match="without the internet, pass --input="):
        next(corpus.read_hub("HuggingFaceFW/fineweb-edu", "sample-10BT"))


def test_tinybooks_ships_and_prepares(tmp_path):
    assert os.path.getsize(os.path.join(ROOT, "data", "tinybooks", "books.jsonl.gz")) < 2.5e6
    meta = corpus.prepare_tinybooks(str(tmp_path))
    assert (meta["train_docs"], meta["val_docs"]) == (5, 1)
    assert meta["train_tokens"] > 1_000_000 and meta["val_tokens"] > 50_000
    assert "TREASURE ISLAND" in decode(read_bin(tmp_path / "val.bin")[:50])


# ---- loader


def write_tokens(path, ids):
    np.asarray(ids, dtype=np.uint16).tofile(path)
    return str(path)


def test_windows_are_slices_of_the_file(tmp_path):
    path = write_tokens(tmp_path / "t.bin", np.arange(1000))
    x = TokenWindows(path, block_size=16).sample(32, seed=0)
    assert x.dtype == torch.long and x.shape == (32, 16)
    assert torch.equal(x, x[:, :1] + torch.arange(16))  # each row is a contiguous run of the file
    # on real prepared text too: every row occurs in the file at some offset
    write_bins(iter(["some words here"] * 40), str(tmp_path), "t", val_every=10, threads=2)
    tokens = read_bin(tmp_path / "train.bin")
    rows = TokenWindows(tmp_path / "train.bin", block_size=8).sample(5, seed=(3, 4)).numpy()
    starts = np.lib.stride_tricks.sliding_window_view(tokens, 8)
    assert all((starts == row).all(axis=1).any() for row in rows)


def test_windows_reproducible_from_seed_and_reach_both_ends(tmp_path):
    path = write_tokens(tmp_path / "t.bin", np.arange(5000) % 997)
    a, b = TokenWindows(path, 32), TokenWindows(path, 32)
    assert torch.equal(a.sample(8, (1, 2, 3)), b.sample(8, (1, 2, 3)))
    assert torch.equal(a.sample(8, 7), b.sample(8, 7))
    assert not torch.equal(a.sample(8, (1, 2, 3)), a.sample(8, (1, 2, 4)))
    assert not torch.equal(a.sample(8, 7), a.sample(8, 8))
    assert torch.equal(a.sample(8, 7, slice(2, 5)), a.sample(8, 7)[2:5])  # a process's rows: the same windows
    short = TokenWindows(write_tokens(tmp_path / "s.bin", np.arange(33)), 32)  # block_size + 1 tokens: 2 windows
    assert set(short.sample(100, 0)[:, 0].tolist()) == {0, 1}


def test_loader_bad_files(tmp_path):
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02\x00\x03")
    with pytest.raises(ValueError, match="5 bytes, not a multiple of 2.*prepare.py"):
        TokenWindows(odd, 2)
    big = write_tokens(tmp_path / "big.bin", [1, 2, 3, VOCAB_SIZE, 4, 5])
    with pytest.raises(ValueError, match=f"token id {VOCAB_SIZE} >= vocab_size {VOCAB_SIZE}.*prepare.py"):
        TokenWindows(big, 2)
    TokenWindows(big, 2, vocab_size=VOCAB_SIZE + 1)  # the same file is fine for a larger vocabulary
    short = write_tokens(tmp_path / "short.bin", np.arange(10))
    with pytest.raises(ValueError, match="10 tokens, fewer than block_size \\+ 1 = 11"):
        TokenWindows(short, 10)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="0 tokens"):
        TokenWindows(tmp_path / "empty.bin", 10)
    with pytest.raises(FileNotFoundError, match="does not exist.*prepare.py"):
        TokenWindows(tmp_path / "missing.bin", 10)


# ---- task folders


def test_a_seeded_subset_keeps_every_class_of_train(tmp_path):
    """A small max_train keeps a row of every class of train (the rest drawn as before), so a dev label is never
    missing because of the subset; a dev label that train lacks altogether is still the user's file's error."""
    from configurator import UserError
    from data.tasks import load_task, train_subset

    def task(folder, train, dev):
        folder.mkdir()
        for split, labels in (("train", train), ("dev", dev)):
            rows = ["sentence\tlabel"] + [f"text {i}\t{y}" for i, y in enumerate(labels)]
            (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")
        return str(folder)

    rare = task(tmp_path / "rare", ["a", "b"] * 100 + ["r1", "r2", "r3"], ["a", "b", "r1", "r2", "r3"])
    for seed in (0, 1337):
        t = load_task(rare, max_train=10, seed=seed)
        assert len(t["train"][1]) == 10 and sorted(set(t["train"][1])) == [0, 1, 2, 3, 4]  # a, b, r1, r2, r3
    # a subset that has every class anyway is the plain seeded one
    common = task(tmp_path / "common", ["a", "b"] * 100, ["a", "b"])
    assert load_task(common, max_train=10)["train"][0] == [(f"text {i}",) for i in train_subset(200, 10)]
    with pytest.raises(UserError, match="absent/dev.tsv: label 'z' is not one of a, b"):
        load_task(task(tmp_path / "absent", ["a", "b"] * 100, ["a", "z"]), max_train=10)
