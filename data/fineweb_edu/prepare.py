"""
FineWeb-Edu (HuggingFaceFW/fineweb-edu, ODC-By 1.0): educational web pages, streamed from the Hugging Face
hub and tokenised up to a token budget (default 1B tokens, 2 GB of uint16). Needs the internet; offline,
--input= reads local files instead (e.g. its parquet shards).

    python data/fineweb_edu/prepare.py --max_tokens=1000000000 [--name=sample-10BT --out_dir=...]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
from configurator import configure
from data import corpus

# corpus.SETTINGS, with this corpus's defaults
DEFAULTS = {**corpus.SETTINGS, "dataset": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT", "max_tokens": 10**9,
            "val_every": 1000, "out_dir": os.path.dirname(os.path.abspath(__file__))}

if __name__ == "__main__":
    s = configure(DEFAULTS, sys.argv[1:], types={"max_tokens": int}, help_from=[__file__, corpus.__file__])
    corpus.prepare(s, "prepare.py")
