"""
Every script's settings, and the one rule for bad input.

    python train.py config/tiny_bert.py --batch_size=32 --compile=False
    python train.py --help              # the script's docstring, then every setting, its default and its comment

A path runs a config file (python assignments); --key=value sets one key, the value read as a Python literal (a bare
word stays a string); a bare --flag sets a boolean to True. Keys and types are checked against the script's defaults
(a default of None takes any value), so a typo is an error, not a silently ignored option.

Bad input, in every script: one line, `<script>: error: <what is wrong and how to fix it>`, exit status 2, and nothing
written. Library code never exits: it raises UserError, whose message names the problem and the fix, or lets the
world's errors through (a path that cannot be read or written, text that is not UTF-8); a script runs its work in
user_errors(), which ends all of those in fail(). A program error is not bad input and keeps its traceback.
"""
import ast
import errno
import os
import sys
import tokenize
import traceback
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path


class UserError(ValueError):
    """Bad input: the message names the file, option or setting, and the fix."""


def fail(message, script=None):
    """End the process as bad input: one line, `<script>: error: <message>`, and exit status 2."""
    print(f"{script or os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    sys.exit(2)


# what the user can do about an OSError, by its errno
FIXES = {errno.ENOENT: "check the path", errno.ENOTDIR: "a part of the path is a file, not a folder: pick another path",
         errno.EISDIR: "it is a folder: pass a file", errno.EEXIST: "remove it or pick another path",
         errno.EACCES: "pick a path you may read and write, or change its permissions",
         errno.EROFS: "pick a path you may write", errno.ENOSPC: "free some space, or write somewhere else"}


# the errors a user can cause from outside a script: a program error is none of these and keeps its traceback
WORLD_ERRORS = (OSError, UnicodeDecodeError)


def not_utf8(path, e, line=None):
    """The message for a file that is not UTF-8 text: the file, the line and column of its first bad byte, the fix.

    e: the UnicodeDecodeError of decoding the whole file, or of one line of it (then pass that line's number).
    """
    column = e.start - e.object.rfind(b"\n", 0, e.start)
    line = line or e.object.count(b"\n", 0, e.start) + 1
    return (f"{path}:{line}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at column {column}); save the file "
            "as UTF-8")


def message(e):
    """The one line for a UserError or a WORLD_ERRORS exception (the path, what is wrong with it and the fix); None for
    anything else, a program error."""
    if isinstance(e, UserError) or isinstance(e, OSError) and e.errno is None:  # an OSError with a message of its own
        return str(e)
    if isinstance(e, UnicodeDecodeError):  # the readers of text files name the file (not_utf8); this is the fallback
        return f"a file is not UTF-8 text ({e.reason}, byte 0x{e.object[e.start]:02x}); save it as UTF-8"
    if not isinstance(e, OSError):
        return None
    path = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
    fix = FIXES.get(e.errno, "check the path")
    return f"{path}: {e.strerror or e}; {fix}" if path is not None else f"{e.strerror or e}; {fix}"


@contextmanager
def user_errors(script):
    """Run a script's work so that every error a user can cause ends in fail(): UserError and WORLD_ERRORS."""
    try:
        yield
    except (UserError, *WORLD_ERRORS) as e:
        fail(message(e), script)


def user_errors_hook(script):
    """user_errors() for a script that runs at module level: a sys.excepthook, so that it holds wherever the error
    is raised. Other exceptions go on to the hook that was there before."""
    previous = sys.excepthook

    def hook(kind, value, tb):  # fail()'s SystemExit, raised in the hook, ends the process with status 2
        if message(value) is not None:
            fail(message(value), script)
        previous(kind, value, tb)
    sys.excepthook = hook


# -----------------------------------------------------------------------------
# Settings: config files, --key=value, --help

def run_config(path, arg):
    """The names a config file assigns. A file that is not UTF-8, does not parse or raises while it runs ends in
    fail(), naming the file and the line."""
    try:
        code = compile(path.read_bytes().decode("utf-8-sig"), str(path), "exec")
    except UnicodeDecodeError as e:
        fail(not_utf8(arg, e))
    except SyntaxError as e:
        fail(f"{arg}:{e.lineno}: {e.msg}; a config file is Python assignments (e.g. batch_size = 32): fix that line")
    scope = {}
    try:
        exec(code, {}, scope)
    except Exception as e:  # the config file is the user's code: whatever it raises is its error, at its line
        line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == str(path)), "?")
        fail(f"{arg}:{line}: {type(e).__name__}: {e}; fix that line of the config file")
    return scope


def setting_comments(path):
    """{name: comment} for the names a file sets with a comment on the same line (`name = ...`, `name: type = ...`, or
    `name=...` in a call), continued by comment lines right below it. In a script, the last one up to the end of the
    statement that assigns `settings` counts (its later code and other dicts do not); in a file without one, the
    first (e.g. model.py's ModelConfig)."""
    with open(path, "rb") as f:
        tokens = list(tokenize.tokenize(f.readline))
    found, names, last, ends = {}, {}, None, False  # names: line -> the names set on it; last: (line, col, names)
    for prev, tok, nxt in zip(tokens, tokens[1:], tokens[2:]):
        if tok.type == tokenize.NAME and nxt.string in ("=", ":") and (prev.string in ("(", ",") or prev.type in (
                tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING)):
            names.setdefault(tok.start[0], []).append(tok.string)
            ends = ends or tok.string == "settings"
        elif tok.type == tokenize.COMMENT:
            line, col, text = *tok.start, tok.string.lstrip("#").strip()
            if line in names:
                last = (line, col, names[line])
                for name in last[2]:
                    found.setdefault(name, []).append(text)
            elif last and (line, col) == (last[0] + 1, last[1]):  # a comment that goes on below the last one
                last = (line, col, last[2])
                for name in last[2]:
                    found[name][-1] += " " + text
        elif tok.type == tokenize.NEWLINE and ends:
            break
    return {name: texts[-1] if ends else texts[0] for name, texts in found.items()}


def usage(defaults, paths):
    """--help's text: the first file's docstring, then every setting with its default and its comment in the files."""
    comments = {}
    for path in reversed(paths):  # the first file's comment wins
        comments.update(setting_comments(path))
    with open(paths[0]) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    shown = {k: f"--{k}={v if isinstance(v, str) else repr(v)}" for k, v in defaults.items()}
    width = max(map(len, shown.values()))
    lines = [f"  {shown[k]:{width}s}  {comments.get(k, '')}".rstrip() for k in defaults]
    return (f"{doc}\n\nSettings, with their defaults; a config file (key = value lines) or --key=value sets them, in "
            "order:\n" + "\n".join(lines))


def configure(defaults, argv, types=None, help_from=()):
    """The settings in `defaults` (a name -> value dict) with argv's overrides (None: the command line's). types: the
    types of settings whose default is None; help_from: where --help reads the docstring (the first) and comments."""
    argv = sys.argv[1:] if argv is None else argv
    if {"--help", "-h"} & set(argv):
        print(usage(defaults, help_from) if help_from else "\n".join(f"--{k}={v!r}" for k, v in defaults.items()))
        sys.exit(0)
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
            try:  # a text setting keeps the text as typed: --out_dir=2024 is "2024", --budgets=2.7e14 "2.7e14"
                value = text if isinstance(config.get(key), str) else ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            set_key(key, value, arg)
        else:
            path = Path(arg)
            if not path.is_file():
                fail(f"{arg}: no such config file; pass a file from config/ or --key=value settings")
            for key, value in run_config(path, arg).items():
                if not key.startswith("_"):
                    set_key(key, value, arg)
    return config


def make_config(settings):
    """The checked ModelConfig of a script's settings: a dict holding some of its fields (other keys are ignored);
    vocab_size 0 is GPT-2's full vocabulary. A shape no model can have is a ValueError that names the setting."""
    from model import ModelConfig  # imported here: the library modules that raise UserError need no torch
    args = {f.name: settings[f.name] for f in fields(ModelConfig) if f.name in settings}
    return ModelConfig(**{**args, "vocab_size": args.get("vocab_size") or 50304})
