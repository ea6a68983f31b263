"""
Scripts keep their settings as plain globals; this overrides them from the command line:

    python train.py config/tiny_bert.py --batch_size=32 --compile=False

A path runs a config file (python assignments); --key=value sets one key, the value
read as a Python literal (a bare word stays a string); a bare --flag sets a boolean to True. Keys and types are checked
against the script's defaults (a default of None takes any value), so a typo is an error, not a silently ignored option.
"""
import ast
import os
import sys
from pathlib import Path


def fail(message, script=None):
    """Bad input ends in one line, `<script>: error: <what and how to fix>`, and exit status 2: no traceback."""
    print(f"{script or os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


def configure(defaults, argv, types=None):
    """The settings in `defaults` (a name -> value dict) with the overrides of argv applied.

    types gives the type of settings whose default is None (None stays allowed for them).
    """
    config, types = dict(defaults), types or {}

    def set_key(key, value, source):
        if key not in config:
            fail(f"{source}: unknown setting {key!r}. Valid settings: {', '.join(sorted(config))}")
        want = type(config[key]) if config[key] is not None else types.get(key)
        if want is float and type(value) is int:
            value = float(value)
        if want is not None and type(value) is not want and not (value is None and key in types):
            fail(f"{source}: {key} must be a {want.__name__}" + (f" like its default {config[key]!r}" if
                 config[key] is not None else "") + f", got {value!r} ({type(value).__name__})")
        config[key] = value

    for arg in argv:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq and isinstance(config.get(key), bool):
                eq, text = "=", "True"  # a bare --flag turns a boolean setting on
            if not eq:
                fail(f"{arg}: expected --key=value, e.g. --{key}=...")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            set_key(key, value, arg)
        else:
            path = Path(arg)
            if not path.is_file():
                fail(f"{arg}: no such config file; pass a file from config/ or --key=value settings")
            scope = {}
            exec(path.read_text(), {}, scope)
            for key, value in scope.items():
                if not key.startswith("_"):
                    set_key(key, value, arg)
    return config
