"""--help on every script: what it does, then its settings with their defaults and the comments beside them."""
import importlib
import os
import subprocess
import sys

import pytest

from configurator import setting_comments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (script, how its help begins, a setting's row: its start and a fragment of its comment)
SETTINGS_SCRIPTS = [
    ("train.py", "Pretrain BERT, CrossBERT or ELECTRA", "--vocab_size=8192", "fewer: a compact"),  # ModelConfig's
    ("bench.py", "Times full training steps", "--warmup=3", "untimed steps first"),
    ("flops.py", "Analytic parameter and FLOP counts", "--n_layer=2", "encoder depth"),  # ModelConfig's comment
    ("experiments/sweep.py", "The paper's comparison at your scale", "--micro_batch=0", "0 = the preset's"),
    ("experiments/acceptance.py", "The GPU acceptance run", "--report=", "experiments/results/gpu/<device>.md"),
    ("experiments/ladder_gpu.py", "The ladder's next runs on one lent GPU", "--minutes=8.0", "from its start to its last"),
    ("probe.py", "Frozen evaluation: how usable", "--max_train=0", "keep a seeded random subset"),
    ("embeddings/embed.py", "Frozen embeddings: a contrastive pooler", "--save_pooler=", "keep the frozen row's trained pooler"),
    ("sample.py", "See what a checkpoint learned", "--neighbours=", "a file of texts"),
    ("hf/export.py", "Export a trained encoder", "--pooler=", "an embed.py --save_pooler file trained on --ckpt"),
    ("experiments/noise.py", "The instrument's noise", "--init_seeds=5", "random twins of --like"),
    ("data/local/prepare.py", "Tokenise your own text", "--val_every=100", "every Nth document goes to val.bin"),
]


@pytest.mark.parametrize("script,begins,setting,comment", SETTINGS_SCRIPTS, ids=[r[0] for r in SETTINGS_SCRIPTS])
def test_help_lists_the_settings_with_defaults_and_comments(script, begins, setting, comment):
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith(begins), out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines() if line.split()[:1] == [setting])
    assert comment in row


@pytest.mark.parametrize("script", ["probe", "embed", "sample", "export"])
def test_the_evaluators_help_shows_every_setting_with_a_comment(script, capsys):
    """Each setting's row: its default, and a comment (the backbone's from evaluation/features.py, e.g. --n_layer's)."""
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    rows = [line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines() if line.startswith("  --")]
    assert e.value.code == 0 and [r[0] for r in rows] == [
        f"--{k}={v if isinstance(v, str) else repr(v)}" for k, v in module.settings.items()]
    assert all(len(r) == 2 for r in rows), [r[0] for r in rows if len(r) < 2]
    if script in ("probe", "embed"):
        assert dict(rows)["--n_layer=2"] == "its encoder depth"


def test_setting_comments_reads_the_settings_not_later_code(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "PRESETS = dict(a=dict(steps=5,  # a preset's steps, not the setting\n"
        "                      width=2))\n"
        "steps = 3              # how many steps\n"
        "width = 4              # the width,\n"
        "                       # in channels\n"
        "plain = 1\n"
        "# a section header, not a continuation\n"
        "settings = dict(rate=0.1,  # the rate\n"
        "                name='x')\n"
        "steps = 7  # after the settings: not read\n")
    found = setting_comments(script)
    assert {k: found.get(k) for k in ("steps", "width", "plain", "rate", "name")} == {
        "steps": "how many steps", "width": "the width, in channels", "plain": None, "rate": "the rate", "name": None}
    (tmp_path / "config.py").write_text("class C:\n    steps: int = 3  # the field's comment\n"
                                        "def f(steps=4):  # a later use\n    pass\n")
    assert setting_comments(tmp_path / "config.py") == {"steps": "the field's comment"}  # no settings: the first
