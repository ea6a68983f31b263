"""
Documents in, token files out: the code every data/<corpus>/prepare.py shares.
Documents come from local files (read_files) or a Hugging Face dataset streamed from the hub
(read_hub); write_bins tokenises them on all cores and streams the ids to train.bin / val.bin
(uint16, each document followed by <|endoftext|>), so memory stays bounded for any corpus size.
prepare_tinybooks() makes the built-in corpus, which train.py prepares at first use; prepare() does what the other
prepare scripts do with their settings (SETTINGS, which each script configures from its command line).
"""
import glob
import gzip
import json
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from configurator import UserError, not_utf8, user_errors
from plumbing.checks import at_least, check_writable

from data.tokenizer import EOT, MASK, PAD, VOCAB_SIZE, get_tokenizer

EXTENSIONS = (".txt", ".jsonl", ".jsonl.gz", ".parquet")
FORMATS = "a folder, file or glob of .txt (one document per file), .jsonl / .jsonl.gz or .parquet (one per row) files"

# the prepare scripts' settings; each script sets its own defaults for some
SETTINGS = dict(
    input="",                 # local text to read instead of --dataset: a folder, file or glob of .txt, .jsonl[.gz]
                              # or .parquet files
    dataset="",               # a Hugging Face dataset to stream, e.g. HuggingFaceFW/fineweb-edu
    name="",                  # the dataset's config, e.g. sample-10BT
    text_key="text",          # the field holding the text in .jsonl/.parquet rows and datasets
    out_dir="",               # where train.bin, val.bin and meta.json go
    max_tokens=None,          # a token budget: stop at the first document end past it; None = no budget
    val_every=100,            # every Nth document goes to val.bin
    threads=os.cpu_count(),   # tokenizer threads
)


def find_files(input):
    """The files `input` names: a file, a glob, or a folder searched recursively for supported files."""
    if os.path.isdir(input):
        paths = [p for p in glob.glob(os.path.join(input, "**", "*"), recursive=True) if p.endswith(EXTENSIONS)]
    else:
        paths = glob.glob(input)
    paths = sorted(p for p in paths if os.path.isfile(p))
    if not paths:
        raise FileNotFoundError(f"no input files at {input!r}; pass --input= {FORMATS}")
    for p in paths:
        if not p.endswith(EXTENSIONS):
            raise UserError(f"{p}: unsupported file type; --input takes {FORMATS}")
    return paths


def read_files(input, text_key="text"):
    """Yield the documents (str) of local files, in sorted path order."""
    for path in find_files(input):
        n = 0  # line number in a .jsonl file, for error messages
        try:
            if path.endswith(".txt"):
                with open(path, "rb") as f:
                    data = f.read()
                if b"\0" in data:  # NUL bytes are valid UTF-8 but never occur in text
                    raise ValueError("it contains NUL bytes, so it is binary, not text")
                yield data.decode("utf-8")
            elif path.endswith(".parquet"):
                import pyarrow.parquet as pq  # comes with `datasets`
                table = pq.ParquetFile(path)
                columns = table.schema_arrow.names
                if text_key not in columns:  # pyarrow's own error is an IndexError that names neither
                    raise UserError(f"{path} has no column {text_key!r} (its columns: {', '.join(columns)}); "
                                    "pass --text_key= with the one that holds the text")
                for batch in table.iter_batches(batch_size=1024, columns=[text_key]):
                    yield from batch.column(0).to_pylist()
            else:
                with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
                    for n, row in enumerate(f, 1):  # decoded a line at a time, so a bad byte's line is known
                        if row.strip():
                            yield json.loads(row.decode("utf-8"))[text_key]
        except UnicodeDecodeError as e:
            raise UserError(f"{not_utf8(path, e, n)}, or remove it from --input") from None
        except UserError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:  # JSON errors are ValueErrors
            where = f"{path}, line {n}" if n else path
            raise UserError(f"cannot read {where}: {e!r}. Convert it to UTF-8 text (with a {text_key!r} field in "
                            "each row of .jsonl/.parquet, or pass --text_key=) or remove it from --input") from e


def read_hub(dataset, name=None, text_key="text"):
    """Yield the documents of a Hugging Face dataset, streamed: nothing is downloaded up front."""
    import datasets
    try:
        ds = datasets.load_dataset(dataset, name, split="train", streaming=True)
    except ConnectionError as e:
        raise ConnectionError(f"cannot reach {dataset} on the Hugging Face hub ({e}); "
                              f"without the internet, pass --input= {FORMATS}") from e
    for row in ds:
        yield row[text_key]


def batches(docs, chars=1 << 20):
    """Group non-empty documents into lists of about `chars` characters: one unit of work for a thread."""
    batch, n = [], 0
    for doc in docs:
        if not isinstance(doc, str):
            raise UserError(f"documents must be str, got {type(doc).__name__}; check --text_key")
        if doc:
            batch.append(doc)
            n += len(doc)
        if n >= chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def tokenize(docs, threads):
    """Yield each document's ids followed by EOT (uint16), in order, encoding on `threads` threads."""
    enc = get_tokenizer()

    def encode_doc(doc):
        try:
            ids = enc.encode_to_numpy(doc, disallowed_special=())  # ordinary text, no Python list of ints
        except UnicodeEncodeError:  # lone surrogates (web JSON has them): encode_ordinary replaces them with U+FFFD
            ids = np.array(enc.encode_ordinary(doc))
        return np.append(ids, EOT).astype(np.uint16)

    def encode(batch):  # tiktoken releases the GIL, so threads run in parallel
        return [encode_doc(doc) for doc in batch]

    with ThreadPoolExecutor(threads) as pool:
        pending = deque()
        for batch in batches(docs):
            pending.append(pool.submit(encode, batch))
            if len(pending) > 2 * threads:  # read ahead a little, but no more: memory stays bounded
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def write_bins(docs, out_dir, source, val_every=100, max_tokens=None, threads=os.cpu_count()):
    """Tokenise `docs` into out_dir/{train,val}.bin and meta.json; every val_every-th document goes to val.
    Stops at the first document boundary past max_tokens. Files appear only once complete (temp file, then rename);
    each writer has temp files of its own, so two that prepare the same folder at once both finish."""
    if val_every < 2:
        raise UserError(f"--val_every={val_every} would leave no training documents; pass 2 or more")
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    splits = ("train", "val")
    mine = f"{os.getpid()}-{threading.get_ident()}.tmp"  # this writer's temp files: another's are not touched
    tmp = {s: os.path.join(out_dir, f"{s}.bin.{mine}") for s in splits}
    files = {s: open(tmp[s], "wb") for s in splits}
    tokens, n_docs = dict.fromkeys(splits, 0), dict.fromkeys(splits, 0)
    t0 = last = time.time()
    # a terminal gets one line rewritten every second; a log file a new line every 30 s, never a carriage return
    every, start, end = (1, "\r", "") if sys.stderr.isatty() else (30, "", "\n")
    try:
        for i, ids in enumerate(tokenize(docs, threads)):
            split = "val" if i % val_every == val_every - 1 else "train"
            ids.tofile(files[split])
            tokens[split] += len(ids)
            n_docs[split] += 1
            total = sum(tokens.values())
            if time.time() - last > every:
                last = time.time()
                budget = f" / {max_tokens / 1e6:,.0f}M" if max_tokens else ""
                print(f"{start}{total / 1e6:,.1f}M{budget} tokens, {i + 1:,} documents, {total / (last - t0):,.0f} tokens/s",
                      end=end, file=sys.stderr, flush=True)
            if max_tokens and total >= max_tokens:
                break
        if last > t0 and end == "":
            print(file=sys.stderr)  # ends the rewritten line
        if n_docs["train"] == 0:
            raise UserError(f"no text in {source}; check --input (and --text_key for .jsonl/.parquet)")
        if n_docs["val"] == 0:
            raise UserError(f"too few documents ({n_docs['train']}) in {source} for --val_every={val_every}: "
                             "the validation split would be empty; pass a smaller --val_every")
    except BaseException:
        for s in splits:
            files[s].close()
            os.remove(tmp[s])
        if created and not os.listdir(out_dir):  # a failed run leaves nothing behind, not even an empty folder
            os.rmdir(out_dir)
        raise
    for s in splits:
        files[s].close()
        os.replace(tmp[s], os.path.join(out_dir, f"{s}.bin"))
    seconds = time.time() - t0
    meta = dict(tokenizer="gpt2 (tiktoken BPE from data/gpt2.tiktoken)", vocab_size=VOCAB_SIZE, dtype="uint16",
                eot=EOT, mask=MASK, pad=PAD, source=source, val_every=val_every, max_tokens=max_tokens,
                train_tokens=tokens["train"], val_tokens=tokens["val"],
                train_docs=n_docs["train"], val_docs=n_docs["val"])
    meta_tmp = os.path.join(out_dir, f"meta.json.{mine}")
    with open(meta_tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_tmp, os.path.join(out_dir, "meta.json"))
    total = tokens["train"] + tokens["val"]
    print(f"{out_dir}: train {tokens['train']:,} tokens ({n_docs['train']:,} docs), val {tokens['val']:,} tokens "
          f"({n_docs['val']:,} docs); {total:,} tokens in {seconds:.1f} s ({total / seconds:,.0f} tokens/s)")
    return meta


TINYBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tinybooks")


def prepare_tinybooks(out_dir=TINYBOOKS):
    """The built-in corpus: the six books in data/tinybooks/books.jsonl.gz to out_dir/{train,val}.bin and meta.json,
    every sixth book (Treasure Island) to val; returns the meta dict."""
    return write_bins(read_files(os.path.join(TINYBOOKS, "books.jsonl.gz")), out_dir, val_every=6,
                      source="tinybooks: six Project Gutenberg novels (public domain), data/tinybooks/books.jsonl.gz")


def prepare(s, script):
    """What a data/<corpus>/prepare.py does with its SETTINGS s: read the documents, write the token files. Bad input
    ends in one line naming `script` (configurator.py's rule), with no traceback."""
    with user_errors(script):
        if not (s["input"] or s["dataset"]):
            raise UserError(f"pass --input= {FORMATS}, or --dataset= a Hugging Face dataset")
        at_least(s, 1, ("threads",))
        if s["max_tokens"] is not None:
            at_least(s, 1, ("max_tokens",), " (leave it out for no budget)")
        check_writable(s["out_dir"], "--out_dir")
        if s["input"]:
            docs, source = read_files(s["input"], s["text_key"]), s["input"]
        else:
            docs = read_hub(s["dataset"], s["name"] or None, s["text_key"])
            source = s["dataset"] + (f" ({s['name']})" if s["name"] else "")
        write_bins(docs, s["out_dir"], source, s["val_every"], s["max_tokens"], s["threads"])
