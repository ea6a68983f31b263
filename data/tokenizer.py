"""
GPT-2 byte-level BPE (the merges RoBERTa uses too) through tiktoken, built from the ranks file
this project carries, so no download is ever needed. Every script tokenises through here.
"""
import base64
import functools
import hashlib
import os
import re

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenisation regex
from configurator import UserError

EOT = 50256   # <|endoftext|>: GPT-2's own separator, between documents in the .bin files
MASK = 50257  # <mask>
PAD = 50258   # <pad>
VOCAB_SIZE = 50304  # 50,259 ids padded to a multiple of 64 for the embedding table

RANKS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt2.tiktoken")
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # = tiktoken's r50k_base


def load_ranks(path=RANKS_PATH):
    """The BPE ranks {token bytes: rank}, after checking the file's sha256."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GPT-2 ranks file {path} is missing; "
                                "restore it with `git checkout data/gpt2.tiktoken`")
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        raise UserError(f"GPT-2 ranks file {path} is corrupted: sha256 {digest}, expected {RANKS_SHA256}; "
                         "restore it with `git checkout data/gpt2.tiktoken`")
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines())}


@functools.lru_cache
def get_tokenizer(path=RANKS_PATH):
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=load_ranks(path),
        special_tokens={"<|endoftext|>": EOT, "<mask>": MASK, "<pad>": PAD},
    )


def encode(text):
    """Token ids of ordinary text: a special token's spelling in the text is encoded as plain text."""
    return get_tokenizer().encode_ordinary(text)


def encode_masked(text):
    """Token ids of text in which each `<mask>` is one <mask> id, a token to fill. The spaces before a <mask> belong to
    it (as in RoBERTa's tokenizer): GPT-2's tokens carry their leading space (" time"), so "upon a <mask>" must leave
    that space to the fill rather than make a token of it. Other special tokens' spellings stay plain text."""
    return get_tokenizer().encode(re.sub(r" *<mask>", "<mask>", text), allowed_special={"<mask>"}, disallowed_special=())


def encode_batch(texts, threads=os.cpu_count()):
    return get_tokenizer().encode_ordinary_batch(texts, num_threads=threads)


def decode(ids):
    return get_tokenizer().decode([int(i) for i in ids])


def compact_vocab(counts, size):
    """A compact vocabulary of `size` ids, as a map from GPT-2 ids (VOCAB_SIZE,) to new ids.

    Small models are head-bound: with GPT-2's 50k ids the LM head costs most of the FLOPs. The
    size - 3 ids most frequent in `counts` (a corpus's token counts) keep an id each, most frequent
    first; every other id becomes <unk> (size - 3); <mask> and <pad> are size - 2 and size - 1.
    """
    if not 4 <= size <= VOCAB_SIZE:
        raise UserError(f"a compact vocabulary needs 4 to {VOCAB_SIZE} ids, got {size}")
    text = np.asarray(counts[:EOT + 1])  # the ids a corpus can hold
    keep = np.argsort(-text, kind="stable")[:size - 3]
    mapping = np.full(VOCAB_SIZE, size - 3, dtype=np.int64)
    mapping[keep] = np.arange(len(keep))
    mapping[MASK], mapping[PAD] = size - 2, size - 1
    return mapping
