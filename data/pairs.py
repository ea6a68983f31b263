"""
Positive pairs for embed.py's contrastive pooler, as token ids: two crops of one document of a local corpus,
the first two text columns of a hub dataset, or a local .tsv / .jsonl file of pairs.
"""
import random
from pathlib import Path

from data.corpus import FORMATS, find_files, read_files
from data.tasks import read_jsonl, utf8_lines
from data.tokenizer import EOT, encode
from configurator import UserError


def crop_pairs(path, seed, passage=64, chars_per_passage=10_000, lo=0.1, hi=0.5):
    """Contriever's independent cropping: two random spans, each 10-50% long, of one passage of one document.
    Our choice: a whole book is too broad to be one "document", so passages of `passage` tokens are
    cut at random places, one per `chars_per_passage` characters of text.
    path: a corpus as data/local/prepare.py reads it, through the same reader."""
    try:
        find_files(str(path))
    except (OSError, ValueError):
        raise UserError(f"--pairs=crop:{path}: no corpus there; pass {FORMATS}") from None
    rng = random.Random(seed)

    def span(ids):
        n = rng.randint(max(1, round(lo * len(ids))), max(1, round(hi * len(ids))))
        start = rng.randint(0, len(ids) - n)
        return ids[start:start + n]

    for text in read_files(str(path)):
        for _ in range(max(1, len(text) // chars_per_passage)):
            start = rng.randrange(max(1, len(text) - 8 * passage))  # 8 characters a token is plenty for English
            ids = encode(text[start:start + 8 * passage])[1:passage + 1]  # the cut may split the first word
            if len(ids) >= 8:
                yield span(ids), span(ids)


def first_two_texts(values, where):
    texts = [v for v in values if isinstance(v, str)]
    if len(texts) < 2:
        raise UserError(f"{where}: expected two text columns, found {len(texts)}; fix: one pair per line, "
                        "`text_a<TAB>text_b` (.tsv) or {\"a\": ..., \"b\": ...} (.jsonl)")
    return texts[0], texts[1]


def text_pairs(spec):
    """(text, text) pairs of a hub dataset (hf:NAME[:CONFIG]) or a local .tsv / .jsonl file."""
    if spec.startswith("hf:"):
        from datasets import load_dataset  # only this source needs it (and the internet)
        name, _, config = spec[3:].partition(":")
        try:
            rows = load_dataset(name, config or None, split="train", streaming=True)
        except Exception as e:  # offline, unknown name or config: all end here
            raise UserError(f"--pairs={spec}: cannot load it from the hub ({str(e).splitlines()[0]}); offline, "
                            "use --pairs=crop:CORPUS or a local .tsv/.jsonl of pairs") from None
        for row in rows:
            yield first_two_texts(row.values(), spec)
        return
    path = Path(spec)
    if not path.is_file() or path.suffix not in (".tsv", ".jsonl"):
        raise UserError(f"--pairs={spec}: no such .tsv or .jsonl file; pass crop:CORPUS, hf:NAME[:CONFIG] or a pairs file")
    if path.suffix == ".jsonl":
        for n, obj in read_jsonl(path):
            yield first_two_texts(obj.values(), f"{path}:{n}")
        return
    for n, line in utf8_lines(path):
        if line.strip():
            yield first_two_texts(line.rstrip("\n").split("\t"), f"{path}:{n}")


def pair_stream(spec, seed, max_len, buffer=4096):
    """Token-id pairs of --pairs through a shuffle buffer: bounded memory, an order reproducible from the seed,
    and runs of pairs of one book or one query spread out (a query repeated in a batch is a false negative)."""
    if spec.startswith("crop:"):
        pairs = crop_pairs(spec[5:], seed)
    else:
        pairs = ((encode(a)[:max_len] or [EOT], encode(b)[:max_len] or [EOT]) for a, b in text_pairs(spec))
    rng, buf = random.Random(seed + 1), []
    for pair in pairs:
        buf.append(pair)
        if len(buf) >= buffer:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    rng.shuffle(buf)
    yield from buf
