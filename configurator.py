"""
Scripts keep their settings as plain globals; this overrides them from the command line:

    python train.py config/tiny_bert.py --batch_size=32 --compile=False
    python train.py --help              # the script's docstring, then every setting, its default and its comment

A path runs a config file (python assignments); --key=value sets one key, the value
read as a Python literal (a bare word stays a string); a bare --flag sets a boolean to True. Keys and types are checked
against the script's defaults (a default of None takes any value), so a typo is an error, not a silently ignored option.

It also holds the rule every script ends bad input with: one line, `<script>: error: <what and how to fix>`, exit
status 2 (fail). Errors the world causes, a path that cannot be read or written and text that is not UTF-8, end
there too: each script runs its work in user_errors() (train.py, which runs at module level, installs
user_errors_hook()), and checks where it will write (check_writable) before it starts.
"""
import ast
import errno
import os
import socket
import sys
import time
import tokenize
import traceback
from contextlib import contextmanager
from pathlib import Path


def fail(message, script=None):
    """Bad input ends in one line, `<script>: error: <what and how to fix>`, and exit status 2: no traceback."""
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


def world_error(e):
    """The one-line message for a WORLD_ERRORS exception: the path, what is wrong with it and the fix."""
    if isinstance(e, UnicodeDecodeError):  # the readers of text files name the file (not_utf8); this is the fallback
        return f"a file is not UTF-8 text ({e.reason}, byte 0x{e.object[e.start]:02x}); save it as UTF-8"
    if e.errno is None:  # raised with a message of its own (e.g. data.corpus's), which names the fix
        return str(e)
    fix = FIXES.get(e.errno, "check the path")
    path = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
    return f"{path}: {e.strerror or e}; {fix}" if path is not None else f"{e.strerror or e}; {fix}"


@contextmanager
def user_errors(script, *more):
    """Run a script's work so that every error a user can cause ends in fail(): the world's (WORLD_ERRORS) and the
    script's own exception types `more`, whose messages already name the fix (e.g. data.tasks.EvalError)."""
    try:
        yield
    except WORLD_ERRORS as e:
        fail(world_error(e), script)
    except more as e:
        fail(str(e), script)


def user_errors_hook(script, *more):
    """user_errors() for a script that runs at module level: a sys.excepthook, so that it holds wherever the error
    is raised. Other exceptions go on to the hook that was there before."""
    previous = sys.excepthook

    def hook(kind, value, tb):  # fail()'s SystemExit, raised in the hook, ends the process with status 2
        if issubclass(kind, WORLD_ERRORS):
            fail(world_error(value), script)
        if issubclass(kind, more):
            fail(str(value), script)
        previous(kind, value, tb)
    sys.excepthook = hook


def interrupt_hook(script, where):
    """Ctrl-C ends in one line, `<script>: <where()>` (what was saved, and how to go on), with no traceback. Other
    exceptions go on to the hook that was there before."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(f"{script}: {where()}", file=sys.stderr)
    sys.excepthook = hook


def at_least(settings, minimum, names, note=""):
    """fail() unless each of the settings `names` is at least `minimum` (note: what such a value means, if special)."""
    for name in names:
        if settings[name] < minimum:
            fail(f"--{name}={settings[name]}: must be at least {minimum}{note}")


def reach_master(seconds, script="train.py"):
    """A process of a multi-process run launched with MASTER_ADDR and MASTER_PORT (torchrun's workers, or a
    scheduler's): wait until the master's address answers, for at most `seconds` (the master may start later), then
    end in one line that names the address and the fix, rather than block in init_process_group for 30 minutes."""
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((addr, port), timeout=5).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                fail(f"rank {os.environ.get('RANK')} cannot reach the master at {addr}:{port} after {seconds:g}s "
                     f"({e.strerror or e}); start node rank 0 too, check --master_addr and --master_port, and that the "
                     "port is open between the nodes (join_timeout sets the wait)", script)
            time.sleep(1)


def check_device(device, dtype):
    """fail() unless this machine has `device` (cpu, cuda or cuda:N) and `dtype` is float32 or bfloat16."""
    if dtype not in ("float32", "bfloat16"):
        fail(f"--dtype={dtype!r}: expected float32 or bfloat16")
    if not device.startswith(("cpu", "cuda")):
        fail(f"--device={device!r}: expected cpu or cuda[:N]")
    import torch  # loaded already by every script that has a device
    if device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"--device={device!r}, but this machine has no CUDA device (or torch is a CPU build); use --device=cpu")


def check_writable(path, setting, folder=True, script=None):
    """Fail now, before any work, unless the run can write `path`: a folder it creates or fills (folder=True), or a
    file. The nearest part of the path that exists must be a folder the user may write in."""
    if os.path.isdir(path) != folder and os.path.exists(path):
        fail(f"{setting}={path} is {'a file' if folder else 'a folder'}, not {'a folder' if folder else 'a file'}; "
             f"pick another {setting}", script)
    parent = os.path.abspath(path if folder else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        fail(f"{setting}={path}: {parent} is a file, not a folder; pick another {setting}", script)
    if not os.access(parent, os.W_OK):
        fail(f"{setting}={path}: no permission to write in {parent}; pick another {setting}", script)


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
    """The settings in `defaults` (a name -> value dict) with the overrides of argv applied.

    types gives the type of settings whose default is None (None stays allowed for them). help_from: the files that
    --help (or -h) reads the script's docstring (the first file's) and the settings' comments from.
    """
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
