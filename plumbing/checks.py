"""The checks every script shares: a lower bound, a device, a writable path, and the one import of an optional extra."""
import importlib
import os

from configurator import UserError


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
