"""
Tokenise your own text: a folder, file or glob of .txt (one document per file), .jsonl / .jsonl.gz or
.parquet (one document per row, text in --text_key) files. Works offline.

    python data/local/prepare.py --input=path/to/texts --out_dir=data/local [--val_every=100 --max_tokens=N]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from data.corpus import main

if __name__ == "__main__":
    main(__file__, sys.argv[1:], out_dir=os.path.dirname(os.path.abspath(__file__)))
