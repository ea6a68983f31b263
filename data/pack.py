"""
What a GPU machine that gets only the repository and a little data beside it needs to run the ladder: the prepared
corpus and the probes' tasks, packed small (experiments/ladder_gpu.py --pack writes it, and unpacks it there).

The web corpus is 57M GPT-2 ids, 115 MB as train.bin, and no general compressor brings that under the 64 MiB that
may travel. But a model with the compact vocabulary reads each id through its map (data/tokenizer.py): 8,189
frequent ids keep an id of their own and every other one is <unk>. So the pack keeps each token's compact id (the
frequent ids first, so they compress well) and the list of ids kept; unpacked, each <unk> becomes a stand-in rare
id, cycling over the ids the map sends to <unk>, each used fewer times than the rarest kept id occurs. The map, the
unigram baseline and every window a model reads are then the original corpus's exactly, which unpack() checks
against the hash of the model's view of the tokens taken when packing. Only the rare ids' spellings are lost, and
no model with that vocabulary can see them.

The tasks keep the training rows the probes use (load_task's seeded subset of max_train) and every dev row, so a
probe scores the same on the pack as on the full folders (pack() checks it).
"""
import hashlib
import json
import lzma
import os
import tarfile
import tempfile

import numpy as np

from data.loader import load_splits
from data.tasks import load_task, read_tsv, task_list, train_subset
from data.tokenizer import EOT
from configurator import UserError

SPLITS = ("train", "val")
XZ = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "lc": 3, "lp": 1, "pb": 1}]  # 2-byte symbols


def view_hash(compact):
    """The sha256 of a split as a model with the compact vocabulary reads it: its ids, uint16 little-endian."""
    return hashlib.sha256(np.ascontiguousarray(compact, dtype="<u2").tobytes()).hexdigest()


def pack_corpus(data_dir, vocab_size, out_dir):
    """out_dir/corpus.xz (each split's compact ids, train then val) and corpus.json (what unpack needs)."""
    windows, vocab_map, unigram = load_splits(data_dir, 2, vocab_size)
    if vocab_map is None:
        raise UserError("a pack keeps the compact vocabulary's ids: pass vocab_size > 0 (the ladder's is 8192)")
    compact = {s: vocab_map[np.asarray(windows[s].tokens)].astype("<u2") for s in SPLITS}
    os.makedirs(out_dir, exist_ok=True)
    with lzma.open(os.path.join(out_dir, "corpus.xz"), "wb", format=lzma.FORMAT_XZ, filters=XZ) as f:
        for s in SPLITS:
            f.write(compact[s].tobytes())
    text = vocab_map[:EOT + 1]
    ids = np.flatnonzero(text < vocab_size - 3)
    kept = [int(i) for i in ids[np.argsort(text[ids])]]  # the GPT-2 id of each kept compact id, in order
    with open(os.path.join(data_dir, "meta.json")) as f:
        meta = json.load(f)
    info = dict(vocab_size=vocab_size, kept=kept, unigram=unigram, meta=meta,
                tokens={s: len(compact[s]) for s in SPLITS}, sha256={s: view_hash(compact[s]) for s in SPLITS})
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(info, f)
    return info


def unpack_corpus(pack_dir, data_dir):
    """data_dir/train.bin, val.bin and meta.json from a pack, checked: the compact vocabulary rebuilt from them and
    the model's view of every token are the packed corpus's. A mismatch is a UserError."""
    with open(os.path.join(pack_dir, "corpus.json")) as f:
        info = json.load(f)
    K, kept = info["vocab_size"], np.array(info["kept"], dtype=np.int64)
    with lzma.open(os.path.join(pack_dir, "corpus.xz")) as f:
        ids = np.frombuffer(f.read(), dtype="<u2")
    to_gpt2 = np.zeros(K, dtype=np.int64)
    to_gpt2[:len(kept)] = kept
    stand_ins = np.setdiff1d(np.arange(EOT + 1), kept)  # the text ids the map sends to <unk>
    os.makedirs(data_dir, exist_ok=True)
    first = 0
    for s in SPLITS:
        compact = ids[first:first + info["tokens"][s]]
        first += len(compact)
        tokens = to_gpt2[compact]
        unk = np.flatnonzero(compact == K - 3)
        tokens[unk] = stand_ins[np.arange(len(unk)) % len(stand_ins)]
        tokens.astype(np.uint16).tofile(os.path.join(data_dir, f"{s}.bin"))
    with open(os.path.join(data_dir, "meta.json"), "w") as f:
        json.dump({**info["meta"], "packed": "rare ids (<unk> to the compact vocabulary) are stand-ins: data/pack.py"},
                  f, indent=1)
    windows, vocab_map, unigram = load_splits(data_dir, 2, K)
    for s in SPLITS:
        if view_hash(vocab_map[np.asarray(windows[s].tokens)]) != info["sha256"][s]:
            raise UserError(f"{data_dir}/{s}.bin unpacked from {pack_dir} is not the packed corpus as the model reads "
                            "it (its hash differs): pack it again with experiments/ladder_gpu.py --pack")
    return info


def pack_tasks(spec, max_train, out_dir):
    """out_dir/devtasks.tar.xz: each task folder of spec with the max_train training rows load_task keeps (in their
    order) and every dev row; load_task reads the same task from it."""
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(os.path.join(out_dir, "devtasks.tar.xz"), "w:xz") as tar:
        for folder in task_list(spec):
            name = os.path.basename(os.path.normpath(folder))
            os.makedirs(os.path.join(tmp, name))
            full = load_task(folder, max_train=max_train)
            for split in ("train", "dev"):
                table = read_tsv(os.path.join(folder, f"{split}.tsv"))
                rows = list(zip(*table.values()))
                if split == "train" and 0 < max_train < len(rows):  # the rows load_task keeps, every class among them
                    labels = table["label"] if full["classes"] else None
                    rows = [rows[i] for i in train_subset(len(rows), max_train, labels=labels)]
                with open(os.path.join(tmp, name, f"{split}.tsv"), "w") as f:
                    f.writelines("\t".join(row) + "\n" for row in [tuple(table), *rows])
            small = load_task(os.path.join(tmp, name), max_train=max_train)
            if any(full[k] != small[k] for k in ("classes", "metrics")) or any(
                    full[s][0] != small[s][0] or not np.array_equal(full[s][1], small[s][1]) for s in ("train", "dev")):
                raise UserError(f"{folder}: its packed copy does not read back as the same task")
            tar.add(os.path.join(tmp, name), arcname=name)


def unpack_tasks(pack_dir, out_dir):
    """The task folders of a pack, under out_dir; returns out_dir."""
    with tarfile.open(os.path.join(pack_dir, "devtasks.tar.xz")) as tar:
        tar.extractall(out_dir, filter="data")
    return out_dir
