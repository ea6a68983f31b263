"""
The one rule for bad input, in every script: one line, `<script>: error: <what is wrong and how to fix it>`, exit
status 2, and nothing written. A program error is not bad input and keeps its traceback.

Library code (model.py, checkpoint.py, data/, features.py) never exits: it raises UserError, whose message names the
problem and the fix, or lets the world's errors through (a path that cannot be read or written, text that is not
UTF-8). A script runs its work in user_errors(), which ends all of those in fail(); train.py, which runs at module
level, installs user_errors_hook() instead. The checks every script shares live here too: a device, a writable path,
a lower bound, and optional(), the one import of an optional extra.
"""
import errno
import importlib
import os
import sys
from contextlib import contextmanager


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


def world_error(e):
    """The one-line message for a WORLD_ERRORS exception: the path, what is wrong with it and the fix."""
    if isinstance(e, UnicodeDecodeError):  # the readers of text files name the file (not_utf8); this is the fallback
        return f"a file is not UTF-8 text ({e.reason}, byte 0x{e.object[e.start]:02x}); save it as UTF-8"
    if e.errno is None:  # raised with a message of its own (e.g. data.corpus's), which names the fix
        return str(e)
    fix = FIXES.get(e.errno, "check the path")
    path = e.filename if e.filename2 is None else f"{e.filename} -> {e.filename2}"
    return f"{path}: {e.strerror or e}; {fix}" if path is not None else f"{e.strerror or e}; {fix}"


def message(e):
    """The one line for a UserError or a WORLD_ERRORS exception; None for anything else (a program error)."""
    if isinstance(e, WORLD_ERRORS):
        return world_error(e)
    if isinstance(e, UserError):
        return str(e)
    return None


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


def interrupt_hook(script, where):
    """Ctrl-C ends in one line, `<script>: <where()>` (what was saved, and how to go on), with no traceback. Other
    exceptions go on to the hook that was there before."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(f"{script}: {where()}", file=sys.stderr)
    sys.excepthook = hook

# -----------------------------------------------------------------------------
# The checks every script shares

# optional extras: the module, the package that brings it, and the pip command that installs it beside the pinned
# torch (mteb and sentence-transformers would otherwise move torch off the pin)
EXTRAS = {"wandb": ("wandb", "pip install wandb"),
          "matplotlib": ("matplotlib", "pip install matplotlib"),
          "mteb": ("mteb", 'pip install mteb "torch==2.13.0"'),
          "transformers": ("transformers", 'pip install transformers "torch==2.13.0"'),
          "accelerate": ("accelerate", 'pip install accelerate "torch==2.13.0"'),
          "safetensors": ("safetensors", "pip install safetensors"),
          "sentence_transformers": ("sentence-transformers", 'pip install "sentence-transformers>=6" "torch==2.13.0"')}


def optional(module, needed_by):
    """Import an optional extra (a top-level module named in EXTRAS, or one of its submodules); where it is not
    installed, a UserError that names what needs it, the package and the pip command."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is None or e.name.split(".")[0] != top:  # the extra is there but broken: a program error
            raise
        package, pip = EXTRAS[top]
        raise UserError(f"{needed_by} needs {package}, which is not installed: {pip}") from None


def at_least(settings, minimum, names, note=""):
    """A UserError unless each of the settings `names` is at least `minimum` (note: what such a value means)."""
    for name in names:
        if settings[name] < minimum:
            raise UserError(f"--{name}={settings[name]}: must be at least {minimum}{note}")


def check_device(device, dtype="float32"):
    """A UserError unless this machine has `device` (cpu, cuda or cuda:N) and `dtype` is float32 or bfloat16."""
    if dtype not in ("float32", "bfloat16"):
        raise UserError(f"--dtype={dtype!r}: expected float32 or bfloat16")
    if not isinstance(device, str) or not device.startswith(("cpu", "cuda")):
        raise UserError(f"--device={device!r}: expected cpu or cuda[:N]")
    import torch  # loaded already by every script that has a device
    try:
        torch.device(device)
    except RuntimeError:
        raise UserError(f"--device={device!r}: expected cpu or cuda[:N]") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device={device!r}, but this machine has no CUDA device (or torch is a CPU build); use "
                        "--device=cpu")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UserError(f"--device={device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s); use "
                        f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")


def check_writable(path, setting, folder=True):
    """A UserError now, before any work, unless the run can write `path`: a folder it creates or fills (folder=True),
    or a file. The nearest part of the path that exists must be a folder the user may write in."""
    if os.path.isdir(path) != folder and os.path.exists(path):
        raise UserError(f"{setting}={path} is {'a file' if folder else 'a folder'}, not "
                        f"{'a folder' if folder else 'a file'}; pick another {setting}")
    parent = os.path.abspath(path if folder else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"{setting}={path}: {parent} is a file, not a folder; pick another {setting}")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{setting}={path}: no permission to write in {parent}; pick another {setting}")
