"""
Random windows of block_size tokens from a uint16 token file (train.bin / val.bin), nanoGPT style.
The file stays memory-mapped: a batch reads only its own windows, and the OS page cache does the rest.
"""
import json
import os

import numpy as np
import torch

from data.tokenizer import VOCAB_SIZE, compact_vocab
from configurator import UserError

FIX = "rebuild it with its prepare script, e.g. python data/tinybooks/prepare.py"


class TokenWindows:
    def __init__(self, bin_path, block_size, vocab_size=VOCAB_SIZE):
        path = str(bin_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"token file {path} does not exist; {FIX}")
        size = os.path.getsize(path)
        if size % 2:
            raise UserError(f"{path} has {size} bytes, not a multiple of 2, so it is not a uint16 token file "
                             f"(or it was cut short); {FIX}")
        meta_path = os.path.join(os.path.dirname(path), "meta.json")
        if os.path.isfile(meta_path):  # the data carries its description: refuse files this model cannot read
            with open(meta_path) as f:
                meta = json.load(f)
            found = (meta.get("dtype"), str(meta.get("tokenizer", "")).split()[0], meta.get("vocab_size"))
            if found != ("uint16", "gpt2", VOCAB_SIZE):
                raise UserError(f"{meta_path} describes {found[0]} ids of the {found[1]!r} tokenizer with vocab_size "
                                 f"{found[2]}, but training reads uint16 ids of the gpt2 tokenizer with vocab_size "
                                 f"{VOCAB_SIZE}; {FIX}")
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)
        if len(self.tokens) < block_size + 1:
            raise UserError(f"{path} has {len(self.tokens):,} tokens, fewer than block_size + 1 = {block_size + 1}; "
                             f"use a smaller block_size or more text ({FIX})")
        # one pass, in chunks of 32 MB so a huge file never sits in memory: how often each id occurs (for the
        # unigram baseline and a compact vocabulary), which also shows the largest id
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        for i in range(0, len(self.tokens), 1 << 24):
            chunk = np.bincount(self.tokens[i:i + (1 << 24)])  # its length is the chunk's largest id + 1
            if len(chunk) > vocab_size:
                raise UserError(f"{path} holds token id {len(chunk) - 1} >= vocab_size {vocab_size}: it was written "
                                 f"by another tokenizer or is corrupted; {FIX}")
            self.counts[:len(chunk)] += chunk
        self.path, self.block_size = path, block_size

    def sample(self, batch_size, seed, rows=slice(None)):
        """(batch_size, block_size) LongTensor of windows at random offsets; seed (int or tuple of ints) fixes them.

        rows picks some of the batch_size windows (e.g. one process's share) without changing any of them.
        """
        starts = np.random.default_rng(seed).integers(0, len(self.tokens) - self.block_size + 1, size=batch_size)
        # one gather of every window's positions: no Python loop over rows (a GPU step is shorter than that loop)
        return torch.from_numpy(self.tokens[starts[rows, None] + np.arange(self.block_size)].astype(np.int64))


def unigram_loss(train_counts, val_counts):
    """Cross-entropy (nats per token) of the val tokens under the train split's token frequencies,
    add-one smoothed over len(train_counts) ids: what a model that ignores context scores."""
    p = (train_counts + 1) / (train_counts.sum() + len(train_counts))
    return float(-(val_counts * np.log(p)).sum() / val_counts.sum())


def load_splits(data_dir, block_size, vocab_size=0):
    """(windows, vocab_map, unigram) of a prepared corpus: the TokenWindows of its train and val splits, the map of a
    compact vocabulary of vocab_size ids (data/tokenizer.py; None for 0, GPT-2's ids) and the unigram baseline in the
    model's own ids: what a model that ignores context and predicts the train split's token frequencies scores on val.
    A val loss near it means the model has learned word frequencies and nothing else."""
    windows = {split: TokenWindows(os.path.join(data_dir, f"{split}.bin"), block_size) for split in ("train", "val")}
    counts = {split: w.counts for split, w in windows.items()}
    vocab_map = compact_vocab(counts["train"], vocab_size) if vocab_size else None
    if vocab_map is not None:  # token counts in the model's own ids
        counts = {split: np.bincount(vocab_map, weights=c, minlength=vocab_size) for split, c in counts.items()}
    return windows, vocab_map, unigram_loss(counts["train"], counts["val"])
