"""
Tokenise your own text: a folder, file or glob of .txt (one document per file), .jsonl / .jsonl.gz or
.parquet (one document per row, text in --text_key) files. Works offline.

    python data/local/prepare.py --input=path/to/texts --out_dir=data/local [--val_every=100 --max_tokens=N]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from configurator import configure
from data import corpus

# corpus.SETTINGS, with this corpus's defaults
DEFAULTS = {**corpus.SETTINGS, "out_dir": os.path.dirname(os.path.abspath(__file__))}

if __name__ == "__main__":
    s = configure(DEFAULTS, sys.argv[1:], types={"max_tokens": int}, help_from=[__file__, corpus.__file__])
    corpus.prepare(s, "prepare.py")
