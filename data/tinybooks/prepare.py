"""
tinybooks: six public-domain novels (about 4.5 MB of English prose, 1.1M GPT-2 tokens) that ship with the
project in books.jsonl.gz, so the default training run works offline. Treasure Island, the sixth book, is
held out as the validation split. See README.md here for the books and their source.

    python data/tinybooks/prepare.py    # writes train.bin, val.bin, meta.json next to this file
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from configurator import configure, user_errors
from data.corpus import TINYBOOKS, prepare_tinybooks

settings = dict(
    out_dir=TINYBOOKS,        # where train.bin, val.bin and meta.json go
)

if __name__ == "__main__":
    s = configure(settings, sys.argv[1:], help_from=[__file__])
    with user_errors("prepare.py"):
        prepare_tinybooks(s["out_dir"])
