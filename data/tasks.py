"""
The evaluation sets, read and checked: GLUE tasks (the official TSV layout, or the hub) and task folders
of the user's for probe.py; STS sets and BEIR retrieval folders for embed.py.

Bad input is an UserError whose message names the file (and line), the problem and the fix.
"""
import csv
import gzip
import io
import json
import math
import os
from collections import namedtuple
from pathlib import Path

import numpy as np

from configurator import UserError, not_utf8


# the settings these messages name: the evaluators' (probe.py, the experiments) and train.py's, whose probes during
# training read the same tasks
TASKS, GLUE_DIR = "--tasks (train.py: --probe_tasks)", "--glue_dir (train.py: --probe_glue_dir)"

# ----------------------------------------------------------------------------
# Classification and regression tasks: GLUE, or a folder of the user's

# TSV columns: the text column(s), then the label; the hub names them as hub_texts, then "label"
Task = namedtuple("Task", "hub columns hub_texts classes metrics")
PAIR, BINARY, NLI = ("sentence1", "sentence2"), ("0", "1"), ("entailment", "not_entailment")
GLUE = {
    "SST-2": Task("sst2", ("sentence", "label"), ("sentence",), BINARY, ("acc",)),
    "CoLA": Task("cola", ("sentence", "label"), ("sentence",), BINARY, ("mcc",)),
    "MRPC": Task("mrpc", ("#1 String", "#2 String", "Quality"), PAIR, BINARY, ("f1", "acc")),
    "STS-B": Task("stsb", PAIR + ("score",), PAIR, None, ("pearson", "spearman")),
    "QQP": Task("qqp", ("question1", "question2", "is_duplicate"), ("question1", "question2"), BINARY, ("f1", "acc")),
    "MNLI": Task("mnli", PAIR + ("gold_label",), ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
                 ("acc",)),
    "QNLI": Task("qnli", ("question", "sentence", "label"), ("question", "sentence"), NLI, ("acc",)),
    "RTE": Task("rte", PAIR + ("label",), PAIR, NLI, ("acc",)),
    "WNLI": Task("wnli", PAIR + ("label",), PAIR, BINARY, ("acc",)),
}
COLA_HEADER = ["source", "label", "original_label", "sentence"]  # CoLA's TSVs have no header row


def read_tsv(path, header=None):
    """{column name: [values]} of a TSV whose first row names the columns (or with the given header).

    Quoting is off, as GLUE's files need: their quote characters are text, not field delimiters.
    """
    if not os.path.isfile(path):
        raise UserError(f"{path} is missing; a task folder needs train.tsv and dev.tsv (dev_matched.tsv for MNLI)")
    try:
        text = Path(path).read_bytes().decode("utf-8-sig")  # utf-8-sig drops MRPC's byte-order mark
    except UnicodeDecodeError as e:
        raise UserError(not_utf8(path, e)) from None
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    rows = [(reader.line_num, row) for row in reader if row]
    names = header or (rows.pop(0)[1] if rows else [])
    if not rows:
        raise UserError(f"{path} has no examples; fill it or leave the task out of {TASKS}")
    for line, row in rows:
        if len(row) != len(names):
            raise UserError(f"{path}:{line}: {len(row)} tab-separated fields where the header has {len(names)}; "
                            "fix or delete that row (a field may not contain a tab)")
    return dict(zip(names, zip(*(row for _, row in rows))))


def pick(table, columns, path):
    """(texts: [tuple of the text columns], raw labels) from a read_tsv() table; the label column is last."""
    missing = [c for c in columns if c not in table]
    if missing:
        raise UserError(f"{path} has no column {missing[0]!r} (its columns: {', '.join(table)}); rename the column")
    *texts, labels = (table[c] for c in columns)
    return list(zip(*texts)), list(labels)


def parses(kind, s):
    try:
        return kind(s) is not None
    except ValueError:
        return False


def finite(s):
    return parses(float, s) and math.isfinite(float(s))


def to_labels(raw, classes, path):
    """Class indices of raw label strings, or floats when classes is None (regression)."""
    bad = [x for x in raw if (x not in classes if classes else not finite(x))]
    if bad:
        expected = f"one of {', '.join(classes)}" if classes else "a finite number"
        raise UserError(f"{path}: label {bad[0]!r} is not {expected}; fix the label column")
    return np.array([classes.index(x) for x in raw]) if classes else np.array([float(x) for x in raw])


def read_table(path, columns, classes, header=None):
    """(texts, labels) of a TSV file: tuples of the text columns, and the last column parsed by to_labels()."""
    texts, raw = pick(read_tsv(path, header), columns, path)
    return texts, to_labels(raw, classes, path)


def glue_split(name, glue_dir, split):
    """(texts, labels) of a GLUE split from the official layout, or from the hub without glue_dir."""
    task = GLUE[name]
    if glue_dir is None:
        import datasets  # only this path needs it
        hub_split = {"train": "train", "dev": "validation_matched" if name == "MNLI" else "validation"}[split]
        try:
            ds = datasets.load_dataset("nyu-mll/glue", task.hub, split=hub_split)
        except Exception as e:  # no internet, no cache, hub down: all end here
            raise UserError(f"cannot load GLUE {name} from the hub (nyu-mll/glue, {task.hub}): "
                            f"{str(e).splitlines()[0]}; offline, pass a folder PATH holding PATH/<TASK>/train.tsv and "
                            f"dev.tsv as {GLUE_DIR}") from None
        return list(zip(*(ds[c] for c in task.hub_texts))), np.array(ds["label"])
    folder = os.path.join(glue_dir, name)
    if not os.path.isdir(folder):
        raise UserError(f"no folder {folder} for GLUE task {name}; put its train.tsv and dev.tsv there, "
                        f"or leave {name} out of {TASKS}")
    path = os.path.join(folder, "dev_matched.tsv" if (name, split) == ("MNLI", "dev") else f"{split}.tsv")
    return read_table(path, task.columns, task.classes, COLA_HEADER if name == "CoLA" else None)


def folder_task(folder):
    """(classes, metrics, {split: (texts, labels)}) of a user's folder with train.tsv and dev.tsv.

    Each has a header row, a `sentence` column (or `sentence1` and `sentence2`) and a `label` column.
    Integer or string labels make it classification, float labels regression.
    """
    paths = {s: os.path.join(folder, f"{s}.tsv") for s in ("train", "dev")}
    tables = {s: read_tsv(p) for s, p in paths.items()}
    columns = ("sentence1", "sentence2", "label") if "sentence1" in tables["train"] else ("sentence", "label")
    data = {s: pick(tables[s], columns, paths[s]) for s in paths}
    labels = data["train"][1] + data["dev"][1]
    numbers = [parses(float, x) for x in labels]
    if any(numbers) and not all(numbers):  # one stray word must not turn a 0/1 task into a 3-class one
        found = sorted(set(labels), key=lambda x: (not parses(float, x), x))
        raise UserError(f"{folder}: the labels mix numbers and words ({', '.join(found[:8])}); fix the stray "
                        "labels, or use words for every class")
    if all(parses(int, x) for x in labels):
        classes = sorted(set(data["train"][1]), key=int)
    elif all(numbers):
        classes = None
    else:
        classes = sorted(set(data["train"][1]))
    if classes is not None and len(classes) < 2:  # any probe scores 100 on it: a meaningless number
        raise UserError(f"{paths['train']}: every label is {classes[0]!r}; a classification task needs at least "
                        "two classes")
    metrics = ("pearson", "spearman") if classes is None else ("acc", "macro_f1") if len(classes) > 2 else ("acc",)
    return classes, metrics, {s: (texts, to_labels(raw, classes, paths[s])) for s, (texts, raw) in data.items()}


def task_list(spec):
    """Task names or folders from a comma-separated list, where a folder without train.tsv stands for its subfolders
    (e.g. DIR/devtasks)."""
    out = []
    for t in filter(None, spec.split(",")):
        is_parent = os.path.isdir(t) and not os.path.exists(os.path.join(t, "train.tsv"))
        out += sorted(os.path.join(t, d) for d in os.listdir(t) if os.path.isdir(os.path.join(t, d))) if is_parent else [t]
    return out


def train_subset(n, max_train, seed=1337, labels=None):
    """The indices, in order, of the seeded random subset of max_train (< n) training examples that load_task keeps.
    With a classification task's labels, each class keeps its first row in the seeded order (so no dev label is missing
    because of the subset) and the next rows of that order fill the rest: a subset that had every class is unchanged."""
    order = np.random.default_rng(seed).permutation(n)
    if labels is None:
        return np.sort(order[:max_train])
    keep = np.zeros(n, bool)
    keep[np.unique(np.asarray(labels)[order], return_index=True)[1]] = True  # each class's first place in the order
    keep[np.flatnonzero(~keep)[:max(0, max_train - keep.sum())]] = True
    return np.sort(order[keep])


def load_task(name, glue_dir=None, max_train=0, seed=1337):
    """A GLUE task by name, or a user's task by folder path: dict(name, classes, metrics, train, dev).

    train and dev are (texts, labels); max_train > 0 keeps a random subset of train (seeded), with every class of
    train in it (train_subset).
    """
    glue_name = {k.upper(): k for k in GLUE}.get(name.upper())
    if glue_name:
        classes, metrics = GLUE[glue_name].classes, GLUE[glue_name].metrics
        data = {s: glue_split(glue_name, glue_dir, s) for s in ("train", "dev")}
    elif os.path.isdir(name):
        classes, metrics, data = folder_task(name)
    else:
        raise UserError(f"unknown task {name!r}; use GLUE names ({','.join(GLUE)}) or the path of a folder "
                        "with train.tsv and dev.tsv")
    texts, labels = data["train"]
    if len(labels) < 2:
        raise UserError(f"task {name} has {len(labels)} training example; the probes need at least 2")
    need = max(2, len(classes or ()))  # the probes hold out part of train, and need an example of each class
    if max_train < 0 or 0 < max_train < need:
        raise UserError(f"task {name}: max_train={max_train} keeps fewer than the {need} training examples the probes "
                        f"need ({'one per class' if classes else 'one to fit, one held out'}); pass at least {need}, "
                        "or 0 for all of train")
    if 0 < max_train < len(labels):
        keep = train_subset(len(labels), max_train, seed, labels if classes else None)
        data["train"] = [texts[i] for i in keep], labels[keep]
    name = glue_name or os.path.basename(os.path.normpath(name))
    return dict(name=name, classes=classes, metrics=metrics, **data)


# ----------------------------------------------------------------------------
# STS sets and BEIR folders

def read_sts(path):
    """{name: [(sentence1, sentence2, score)]}: STS-B in GLUE's layout (a folder with dev.tsv), or SemEval-style
    files of `score<TAB>sentence1<TAB>sentence2` lines (a file, or every .tsv/.txt file of a folder)."""
    p, columns = Path(path), ("sentence1", "sentence2", "score")
    if (p / "dev.tsv").is_file():
        files = {p.name: (p / "dev.tsv", None)}  # GLUE's header names the columns
    else:
        found = sorted(f for f in p.iterdir() if f.suffix in (".tsv", ".txt")) if p.is_dir() else [p]
        if not found or not found[0].is_file():
            raise UserError(f"--sts={path}: no STS-B dev.tsv and no .tsv/.txt files of `score<TAB>s1<TAB>s2` lines there")
        files = {f"{p.name}/{f.stem}" if p.is_dir() else f.stem: (f, ("score",) + columns[:2]) for f in found}
    return {name: [(a, b, y) for (a, b), y in zip(*read_table(f, columns, None, header))]
            for name, (f, header) in files.items()}


def read_beir(folder):
    """(corpus {doc id: title + text}, queries {query id: text}, qrels {query id: {doc id: grade > 0}})."""
    p = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        if not (p / name).is_file():
            raise UserError(f"--beir={folder}: no {name}; a BEIR folder holds corpus.jsonl, queries.jsonl, qrels/test.tsv")
    corpus = {str(d["_id"]): f"{d.get('title') or ''} {d['text']}".strip()
              for _, d in read_jsonl(p / "corpus.jsonl", ["_id", "text"])}
    queries = {str(q["_id"]): q["text"] for _, q in read_jsonl(p / "queries.jsonl", ["_id", "text"])}
    qrels, path = {}, p / "qrels/test.tsv"
    lines = utf8_lines(path)
    if next(lines, (1, ""))[1].rstrip("\n").split("\t") != ["query-id", "corpus-id", "score"]:
        raise UserError(f"{path}:1: expected the header query-id<TAB>corpus-id<TAB>score; fix: add it")
    for n, line in lines:
        if not line.strip():
            continue
        r = line.rstrip("\n").split("\t")
        if len(r) != 3 or not r[2].lstrip("-").isdigit():
            raise UserError(f"{path}:{n}: expected query-id<TAB>corpus-id<TAB>integer score; fix that line")
        if r[0] not in queries:
            raise UserError(f"{path}:{n}: query id {r[0]!r} is not in queries.jsonl; fix the id or add the query")
        if int(r[2]) > 0:  # grade 0 (judged not relevant) counts the same as unjudged for both metrics
            qrels.setdefault(r[0], {})[r[1]] = int(r[2])
    if not qrels:
        raise UserError(f"{path}: no query has a relevant doc (score > 0); nothing to evaluate")
    return corpus, queries, qrels


def read_jsonl(path, keys=()):
    """(line number, object) of a .jsonl or .jsonl.gz file; every object must have the string fields `keys`."""
    for n, line in utf8_lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not valid JSON ({e.msg}); fix: one JSON object per line") from None
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) for k in keys):
            found = ", ".join(obj) if isinstance(obj, dict) else type(obj).__name__
            raise UserError(f"{path}:{n}: expected a JSON object with the string fields {list(keys)} (found: {found}); "
                            "fix that line")
        yield n, obj


def utf8_lines(path):
    """(line number, line) of a UTF-8 text file (.gz: gzip-compressed), "\\r\\n" read as "\\n"; a line that is not
    UTF-8 is an UserError that names the file and the line."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
        for n, raw in enumerate(f, 1):  # decoded a line at a time, so a bad byte's line is known
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # -sig: a byte-order mark is not text
            except UnicodeDecodeError as e:
                raise UserError(not_utf8(path, e, n)) from None
            yield n, line[:-2] + "\n" if line.endswith("\r\n") else line
