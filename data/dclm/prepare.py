"""
DCLM-baseline (mlfoundations/dclm-baseline-1.0, CC BY 4.0): filtered Common Crawl web text, streamed from
the Hugging Face hub and tokenised up to a token budget (default 1B tokens, 2 GB of uint16). Needs the
internet and the zstandard package (its shards are .jsonl.zst); offline, --input= reads local files instead.

    python data/dclm/prepare.py --max_tokens=1000000000 [--out_dir=...]
"""
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from configurator import configure, fail
from data import corpus

# corpus.SETTINGS, with this corpus's defaults
DEFAULTS = {**corpus.SETTINGS, "dataset": "mlfoundations/dclm-baseline-1.0", "max_tokens": 10**9, "val_every": 1000,
            "out_dir": os.path.dirname(os.path.abspath(__file__))}

if __name__ == "__main__":
    if importlib.util.find_spec("zstandard") is None and not any(a.startswith(("--input", "--help", "-h"))
                                                                   for a in sys.argv[1:]):
        fail("DCLM's shards are zstd-compressed: pip install zstandard, or pass --input= local files", "prepare.py")
    s = configure(DEFAULTS, sys.argv[1:], types={"max_tokens": int}, help_from=[__file__, corpus.__file__])
    corpus.prepare(s, "prepare.py")
