"""Bad input ends in one line, `<script>: error: ...`, exit status 2, and writes nothing: settings, and the errors
of the world (paths that cannot be read or written, text that is not UTF-8, config files that do not run, sizes that
leave nothing to do) for every command-line script. "{w}" in a row is a folder of such files (the world fixture)."""
import json
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest

from conftest import script_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--compile=False", "--eval_iters=1"]

# (arguments, a fragment of the expected message); every row must exit 2 with one line on stderr
CASES = [
    (["--max_iters=-5"], "max_iters=-5: must be at least 1"),
    (["--max_iters=0"], "max_iters=0: must be at least 1"),
    (["--grad_clip=-1"], "grad_clip=-1.0: must be at least 0"),
    (["--cms=no"], "cms must be a bool"),
    (["--pred_layer=0"], "pred_layer=0: CrossBERT needs a predictor"),
    (["--model_type=electra", "--gen_layer=0"], "gen_layer=0: ELECTRA needs a generator of at least 1 block"),
    (["--model_type=electra", "--gen_width=0"], "gen_width=0.0: ELECTRA's generator width is a fraction"),
    (["--model_type=electra", "--random_replace=True"], "random_replace (BERT's 80/10/10) would show ELECTRA's"),
    (["--rtd_weight=-1"], "rtd_weight=-1.0: must be at least 0"),
    (["--mask_ratio=half"], "mask_ratio must be a float"),
    (["--mask_ratio=1.5"], "mask_ratio=1.5: must be strictly between 0 and 1"),
    (["--n_head=3", "--n_embd=64"], "n_embd=64 must split into n_head=3 heads"),
    (["--eval_interval=0"], "eval_interval=0: must be at least 1"),
    (["--log_interval=0"], "log_interval=0: must be at least 1"),
    (["--batch_size=0"], "batch_size=0: must be at least 1"),
    (["--n_head=0"], "n_head=0: must be at least 1"),
    (["--n_layer=0"], "n_layer=0: must be at least 1"),
    (["--eval_iters=0"], "eval_iters=0: must be at least 1"),
    (["--dtype=float61"], "dtype='float61': expected float32 or bfloat16"),
    (["--device=tpu"], "device='tpu': expected cpu or cuda"),
    (["--model_type=gpt"], "model_type='gpt': expected one of bert, crossbert, electra"),
    (["--vocab_size=2"], "vocab_size=2: a compact vocabulary has 4 to"),
    (["--init_from=maybe"], "init_from='maybe': expected scratch or resume"),
    (["--total_batch_size=100"], "the nearest values that work are 96 and 128"),
    (["--mask_ratio=0.6"], "mask_ratio=0.6 is not one of them"),
    (["--fsdp=True"], "fsdp=True shards over processes"),
    (["--init_from=resume"], "init_from=resume: no checkpoint"),
    (["--batchsize=4"], "unknown setting 'batchsize'"),
    (["--dataset=no/such/data"], "does not exist"),
    # the world: paths, encodings, config files, sizes
    (["--out_dir={w}/afile/out"], "out_dir={w}/afile/out: {w}/afile is a file, not a folder; pick another out_dir"),
    (["--out_dir={w}/afile"], "out_dir={w}/afile is a file, not a folder"),
    (["--probe_interval=1", "--probe_tasks={w}/no_such_task"], "probe_tasks: unknown task '{w}/no_such_task'"),
    (["{w}/broken.py"], "{w}/broken.py:2: '(' was never closed; a config file is Python assignments"),
    (["{w}/raises.py"], "{w}/raises.py:2: NameError: name 'undefined_name' is not defined; fix that line"),
    (["{w}/latin1.py"], "{w}/latin1.py:2: not UTF-8 text (byte 0xe9 at column 6); save the file as UTF-8"),
    (["--probe_interval=1", "--probe_tasks={w}/latin1_task"], "probe_tasks: {w}/latin1_task/train.tsv:3: not UTF-8"),
    (["--probe_interval=1", "--probe_tasks={w}/task3", "--probe_max_train=2"],
     "max_train=2 keeps fewer than the 3 training examples the probes need (one per class)"),
    # the task readers' messages name train.py's own settings too, not only the evaluators'
    (["--probe_interval=1", "--probe_tasks=QNLI", "--probe_glue_dir={w}"], "leave QNLI out of --tasks (train.py: "
     "--probe_tasks)"),
]
if not __import__("torch").cuda.is_available():
    CASES.append((["--device=cuda"], "this machine has no CUDA device"))


@pytest.fixture
def world(tmp_path):
    """Files a user may pass by mistake, in tmp_path/world: a regular file where a folder belongs, config files that
    do not parse, raise or are not UTF-8, Latin-1 data files, a task with 3 classes; and good small inputs."""
    w = tmp_path / "world"
    w.mkdir()
    (w / "afile").write_text("a regular file\n")
    (w / "broken.py").write_text("batch_size = 4\nn_layer = (\n")
    (w / "raises.py").write_text("batch_size = 4\nn_layer = undefined_name\n")
    (w / "latin1.py").write_bytes("batch_size = 4\n# caf\xe9 au lait\n".encode("latin-1"))
    for name, labels, encoding in (("task3", "012", "utf-8"), ("latin1_task", "01", "latin-1")):
        (w / name).mkdir()
        for split in ("train", "dev"):
            rows = [("caf\xe9" if i == 1 else "tea") + f" number {i}\t{labels[i % len(labels)]}" for i in range(12)]
            (w / name / f"{split}.tsv").write_bytes("\n".join(["sentence\tlabel"] + rows).encode(encoding) + b"\n")
    (w / "sts.tsv").write_text("".join(f"{i % 5}.0\tsentence {i}\tother {i * 7 % 11}\n" for i in range(20)))
    (w / "latin1_sts.tsv").write_bytes("1.0\ta\tb\n2.0\tcaf\xe9\tb\n".encode("latin-1"))
    (w / "pairs.tsv").write_text("".join(f"left {i}\tright {i}\n" for i in range(80)))
    (w / "latin1_pairs.tsv").write_bytes("a\tb\nc\td\ncaf\xe9\tb\n".encode("latin-1"))
    (w / "latin1_beir" / "qrels").mkdir(parents=True)
    (w / "latin1_beir" / "corpus.jsonl").write_bytes('{"_id": "d1", "text": "caf\xe9"}\n'.encode("latin-1"))
    (w / "latin1_beir" / "queries.jsonl").write_text('{"_id": "q1", "text": "coffee"}\n')
    (w / "latin1_beir" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    for name, encoding in (("corpus", "utf-8"), ("latin1_corpus", "latin-1")):
        (w / name).mkdir()
        for i in range(3):
            (w / name / f"{i}.txt").write_bytes(f"book {i}\nthe caf\xe9 on the corner\n".encode(encoding))
    (w / "latin1.jsonl").write_bytes('{"text": "fine"}\n{"text": "caf\xe9"}\n'.encode("latin-1"))
    return w


def snapshot(folder):
    """Every path under folder, with the bytes of each file: equal snapshots mean nothing was written."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    for split, n in [("train", 5_000), ("val", 1_000)]:
        rng.integers(0, 100, n, dtype=np.uint16).tofile(d / f"{split}.bin")
    return d


def run(args, dataset, out_dir):
    cmd = [sys.executable, "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={out_dir}", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_setting_is_one_line(args, message, dataset, world, tmp_path, monkeypatch, capsys):
    # in this process (importing torch once is most of a subprocess's time); exactly what `python train.py` runs
    args, message = [a.replace("{w}", str(world)) for a in args], message.replace("{w}", str(world))
    monkeypatch.setattr(sys, "argv", ["train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path / 'out'}", *args])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # train.py installs its own: restored afterwards
    before = snapshot(world)
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("train.py: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists() and snapshot(world) == before  # checked before anything is written


# the other scripts, run as `python <script>` runs them, with BASE[script] first (later arguments win); rows as CASES
BASE = {
    "probe.py": ["--ckpt=random", "--n_layer=1", "--n_embd=32", "--n_head=2", "--tasks={w}/task3"],
    "embeddings/embed.py": ["--ckpt=random", "--n_layer=1", "--n_embd=32", "--n_head=2", "--sts={w}/sts.tsv"],
    "sample.py": ["--ckpt={w}/none.pt", "--device=cpu"],
    "hf/export.py": ["--ckpt={w}/none.pt"],
    "experiments/sweep.py": ["--glue_dir=", "--glue_tasks=", "--sts=", "--tasks={w}/task3", "--out_dir={w}/sweep",
                             "--axes=main", "--families=bert", "--random_seeds=0", "--compile=False"],
    "bench.py": ["--n_layer=1", "--n_embd=32", "--n_head=2", "--block_size=32", "--compile=False", "--warmup=0",
                 "--steps=1", "--batch_size=2", "--dtype=float32", "--device=cpu"],
    "flops.py": [],
    "experiments/acceptance.py": ["--smoke", "--device=cpu", "--tasks={w}/task3", "--report={w}/report/cpu.md",
                                  "--work_dir={w}/work"],
    "data/local/prepare.py": ["--input={w}/corpus", "--out_dir={w}/prepared", "--val_every=2"],
    "data/tinybooks/prepare.py": [],
}
WORLD = [
    ("probe.py", ["--out={w}/afile/probe.json"], "--out={w}/afile/probe.json: {w}/afile is a file, not a folder"),
    ("probe.py", ["--out={w}"], "--out={w} is a folder, not a file; pick another --out"),
    ("probe.py", ["--tasks={w}/latin1_task"], "{w}/latin1_task/train.tsv:3: not UTF-8 text (byte 0xe9 at column 4)"),
    ("probe.py", ["--batch_size=0"], "--batch_size=0: must be at least 1"),
    ("probe.py", ["--max_train=2"], "task {w}/task3: max_train=2 keeps fewer than the 3 training examples"),
    ("probe.py", ["--max_train=-1"], "max_train=-1 keeps fewer than the 3 training examples"),
    ("embeddings/embed.py", ["--out={w}/afile/embed.json"], "--out={w}/afile/embed.json: {w}/afile is a file, not a folder"),
    ("embeddings/embed.py", ["--sts={w}/latin1_sts.tsv"], "{w}/latin1_sts.tsv:2: not UTF-8 text (byte 0xe9 at column 8)"),
    ("embeddings/embed.py", ["--beir={w}/latin1_beir"], "{w}/latin1_beir/corpus.jsonl:1: not UTF-8 text"),
    ("embeddings/embed.py", ["--pairs={w}/latin1_pairs.tsv"], "{w}/latin1_pairs.tsv:3: not UTF-8 text (byte 0xe9 at column 4)"),
    ("embeddings/embed.py", ["--pairs=crop:{w}/latin1_corpus"], "{w}/latin1_corpus/0.txt:2: not UTF-8 text (byte 0xe9"),
    ("embeddings/embed.py", ["--pairs={w}/pairs.tsv", "--batch_size=0"], "--batch_size=0: contrastive training needs at least 2"),
    ("embeddings/embed.py", ["--pairs={w}/pairs.tsv", "--batch_size=1"], "--batch_size=1: contrastive training needs at least 2"),
    ("embeddings/embed.py", ["--steps=0"], "--steps at least 1 (got 0)"),
    ("embeddings/embed.py", ["--pooler=max"], "--pooler='max': expected one of attn, mean"),
    ("embeddings/embed.py", ["--unfreeze=yes"], "unfreeze must be a bool"),
    ("probe.py", ["--model_type=gpt"], "--model_type='gpt': expected one of bert, crossbert, electra"),
    ("probe.py", ["--max_train=all"], "max_train must be a int"),
    ("sample.py", ["--text=a <mask>", "--top_k=many"], "top_k must be a int"),
    ("sample.py", ["--text=a <mask>", "--top_k=0"], "--top_k=0: must be at least 1"),
    ("hf/export.py", [], "--out=FOLDER is needed"),
    ("hf/export.py", ["--out={w}/afile/export"], "--out={w}/afile/export: {w}/afile is a file, not a folder"),
    ("experiments/sweep.py", ["--out_dir={w}/afile/sweep"],
     "--out_dir={w}/afile/sweep: {w}/afile is a file, not a folder"),
    ("experiments/sweep.py", ["--tasks={w}/latin1_task"], "--tasks: {w}/latin1_task/train.tsv:3: not UTF-8 text"),
    ("experiments/sweep.py", ["{w}/broken.py", "--dry_run"], "{w}/broken.py:2: '(' was never closed"),
    ("experiments/sweep.py", ["{w}/latin1.py", "--dry_run"], "{w}/latin1.py:2: not UTF-8 text"),
    ("experiments/sweep.py", ["--nproc=-1", "--dry_run"], "--nproc=-1: must be at least 0 (0 = the preset's)"),
    ("experiments/sweep.py", ["--axes=main,mask_ratio", "--dry_run"],
     "--axes: unknown mask_ratio; expected a comma-separated"),
    ("bench.py", ["{w}/broken.py"], "{w}/broken.py:2: '(' was never closed"),
    ("bench.py", ["{w}/latin1.py"], "{w}/latin1.py:2: not UTF-8 text"),
    ("bench.py", ["--steps=0"], "--steps=0: must be at least 1"),
    ("bench.py", ["--batch_size=0"], "--batch_size=0: must be at least 1"),
    ("flops.py", ["{w}/broken.py"], "{w}/broken.py:2: '(' was never closed"),
    ("flops.py", ["{w}/raises.py"], "{w}/raises.py:2: NameError: name 'undefined_name' is not defined"),
    ("flops.py", ["{w}/latin1.py"], "{w}/latin1.py:2: not UTF-8 text"),
    ("flops.py", ["--n_embd=64", "--n_head=3"], "must split into n_head=3 heads"),
    ("flops.py", ["--n_layer=0"], "n_layer=0: must be at least 1"),
    ("probe.py", ["--ckpt=random", "--n_embd=64", "--n_head=3", "--tasks={w}/task3"], "must split into n_head=3 heads"),
    ("experiments/acceptance.py", ["--report={w}/afile/cpu.md"],
     "--report={w}/afile/cpu.md: {w}/afile is a file, not a folder"),
    ("experiments/acceptance.py", ["--work_dir={w}/afile/work"],
     "--work_dir={w}/afile/work: {w}/afile is a file, not a folder"),
    ("experiments/acceptance.py", ["--tasks={w}/latin1_task"],
     "--tasks: {w}/latin1_task/train.tsv:3: not UTF-8 text"),
    ("experiments/acceptance.py", ["{w}/broken.py"], "{w}/broken.py:2: '(' was never closed"),
    ("experiments/acceptance.py", ["--max_train=2"],
     "--tasks: task {w}/task3: max_train=2 keeps fewer than the 3 training"),
    ("experiments/acceptance.py", ["--bench_steps=0"], "--bench_steps=0: must be at least 1"),
    ("data/local/prepare.py", ["--out_dir={w}/afile/out"], "--out_dir={w}/afile/out: {w}/afile is a file, not a"),
    ("data/local/prepare.py", ["--input={w}/latin1_corpus"], "{w}/latin1_corpus/0.txt:2: not UTF-8 text (byte 0xe9"),
    ("data/local/prepare.py", ["--input={w}/latin1.jsonl"], "{w}/latin1.jsonl:2: not UTF-8 text (byte 0xe9 at column"),
    ("data/local/prepare.py", ["--threads=0"], "--threads=0: must be at least 1"),
    ("data/local/prepare.py", ["--max_tokens=0"], "--max_tokens=0: must be at least 1 (leave it out for no budget)"),
    ("data/tinybooks/prepare.py", ["--out_dir={w}/afile/out"], "{w}/afile/out: Not a directory; a part of the path is"),
]


@pytest.mark.parametrize("script,args,message", WORLD,
                         ids=[f"{r[0]} {' '.join(r[1])}" for r in (getattr(r, "values", r) for r in WORLD)])
def test_the_world_is_one_line(script, args, message, world, monkeypatch, capsys):
    args = [a.replace("{w}", str(world)) for a in BASE[script] + args]
    monkeypatch.setattr(sys, "argv", [script, *args])
    before = snapshot(world)
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
    err = capsys.readouterr().err
    name = os.path.basename(script)
    assert e.value.code == 2 and err.startswith(f"{name}: error: ") and err.count("\n") == 1, err
    assert message.replace("{w}", str(world)) in err
    assert snapshot(world) == before  # checked before anything is written


# the evaluators' own arguments, enough to reach their checks
EVALUATORS = {"probe.py": [], "embeddings/embed.py": ["--sts=sts.tsv"], "sample.py": ["--text=a <mask>"],
              "hf/export.py": ["--out=x"]}


@pytest.mark.parametrize("script", EVALUATORS)
def test_an_unknown_setting_is_one_line(script, monkeypatch, capsys):
    assert "unknown setting 'bogus'" in script_error(monkeypatch, capsys, script, *EVALUATORS[script], "--bogus=1")


@pytest.mark.parametrize("device, message", [
    ("tpu", "--device='tpu': expected cpu or cuda[:N]"),
    ("cuda", "--device='cuda', but this machine has no CUDA device (or torch is a CPU build); use --device=cpu"),
    ("cuda:99", "--device='cuda:99', but this machine has"),  # no CUDA device, or fewer than 100
])
@pytest.mark.parametrize("script", ["probe.py", "embeddings/embed.py", "sample.py"])
def test_a_device_this_machine_lacks_is_one_line(script, device, message):
    import importlib

    import torch
    from conftest import assert_one_line_error
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    main = importlib.import_module(os.path.basename(script).removesuffix(".py")).main
    assert_one_line_error(main, [*EVALUATORS[script], f"--device={device}"], os.path.basename(script), message)


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_a_full_disk_mid_run_is_one_line(dataset, tmp_path):
    """The rule holds wherever train.py is: here its first checkpoint meets a full disk (/dev/full)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    tmp_path.joinpath("ckpt.pt.tmp").symlink_to("/dev/full")
    out = run(["--total_batch_size=64", "--eval_interval=1", "--max_iters=1"], dataset, tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr == f"train.py: error: {tmp_path}/ckpt.pt.tmp: No space left on device; free some space, or " \
                         "write somewhere else\n"
    assert sorted(os.listdir(tmp_path)) == ["log.jsonl"]  # no checkpoint, no half-written one


def test_a_program_error_keeps_its_traceback(monkeypatch):
    """Only the errors a user causes become one line: anything else is a bug, and its traceback is the report."""
    from configurator import UserError, user_errors, user_errors_hook
    with pytest.raises(ZeroDivisionError), user_errors("x.py"):
        1 / 0
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(exc[0]))
    user_errors_hook("x.py")
    sys.excepthook(ZeroDivisionError, ZeroDivisionError(), None)
    assert seen == [ZeroDivisionError]  # handed on to the hook that was there before
    for error in (FileNotFoundError(2, "No such file or directory", "x.txt"), UserError("x")):
        with pytest.raises(SystemExit) as e:
            sys.excepthook(type(error), error, None)
        assert e.value.code == 2 and seen == [ZeroDivisionError]


def test_checkpoint_is_never_replaced_silently(dataset, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "ckpt.pt").write_bytes(b"precious")
    args = ["train.py", *TINY, f"--dataset={dataset}", f"--out_dir={out_dir}"]
    err = script_error(monkeypatch, capsys, *args)
    assert "already holds a checkpoint" in err and "--overwrite=True" in err
    assert (out_dir / "ckpt.pt").read_bytes() == b"precious"
    for content, fragment in [(b"", "is empty (0 bytes)"), (b"not a zip", "is truncated or not a checkpoint")]:
        (out_dir / "ckpt.pt").write_bytes(content)
        assert fragment in script_error(monkeypatch, capsys, *args, "--init_from=resume")


def test_data_description_must_match(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    for split in ("train", "val"):
        np.zeros(1000, np.uint16).tofile(d / f"{split}.bin")
    (d / "meta.json").write_text(json.dumps({"dtype": "uint32", "tokenizer": "gpt2", "vocab_size": 50304}))
    out = run([], d, tmp_path / "out")
    assert out.returncode == 2 and "describes uint32 ids" in out.stderr


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_resumed_log_has_no_duplicates_and_scratch_log_is_new(dataset, tmp_path):
    args = ["--total_batch_size=64", "--eval_interval=2", "--log_interval=1"]
    assert run(args + ["--max_iters=4"], dataset, tmp_path).returncode == 0
    ckpt = __import__("torch").load(tmp_path / "ckpt.pt", weights_only=True)
    ckpt["step"] = 2  # as if the run had stopped right after its step-2 checkpoint
    __import__("torch").save(ckpt, tmp_path / "ckpt.pt")
    assert run(args + ["--max_iters=4", "--init_from=resume"], dataset, tmp_path).returncode == 0
    records = [json.loads(x) for x in open(tmp_path / "log.jsonl")]
    train_steps = [r["step"] for r in records if "loss" in r]
    val_steps = [r["step"] for r in records if "val_loss" in r]
    assert train_steps == [1, 2, 3, 4] and val_steps == [0, 2, 4]
    assert run(args + ["--max_iters=1", "--overwrite=True"], dataset, tmp_path).returncode == 0
    records = [json.loads(x) for x in open(tmp_path / "log.jsonl")]
    assert [r["step"] for r in records if "loss" in r] == [1]


@pytest.mark.parametrize("script,args,message", [
    ("data/local/prepare.py", ["--input=no/such/files"], "no input files at"),
    ("bench.py", ["--flash_check", "--device=cpu"], "--flash_check needs a CUDA device"),
    ("bench.py", ["--n_layr=2"], "unknown setting 'n_layr'"),
    ("flops.py", ["--n_embd=big"], "n_embd must be a int"),
    ("flops.py", ["--block_size=33"], "CrossBERT: CMS with mask_ratio=0.5 cuts each sequence into 2 views"),
    ("experiments/sweep.py", ["--preset=tpu"], "--preset='tpu': expected one of cpu, cpu-gutenberg, ladder, gpu"),
    ("experiments/noise.py", ["--like=no/such.pt", "--tasks=x"], "no/such.pt: no such checkpoint"),
    ("experiments/noise.py", ["--like=x", "--init_seeds=1"], "--init_seeds and --probe_seeds: at least 2 each"),
    ("experiments/noise.py", ["--like=x", "--tasks=x", "--out=README.md/noise.json"],
     "README.md is a file, not a folder; pick another --out"),
])
def test_other_scripts_end_bad_input_in_one_line(script, args, message, tmp_path, monkeypatch, capsys):
    out_dir = [f"--out_dir={tmp_path / 'out'}"] if "prepare" in script else []
    assert message in script_error(monkeypatch, capsys, script, *args, *out_dir)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # seconds of whole runs for plumbing, not an idea: RUN_SLOW=1 (and CI) runs it
def test_ctrl_c_names_the_checkpoint(dataset, tmp_path):
    import signal
    import time
    cmd = [sys.executable, "-u", "train.py", *TINY, f"--dataset={dataset}", f"--out_dir={tmp_path}",
           "--total_batch_size=64", "--eval_interval=1", "--max_iters=100000"]
    # a Ctrl-C at a terminal: the child gets SIGINT's default action even where this process has it ignored (a
    # background job's, whose children would ignore the signal too, except while a checkpoint is saved)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:  # wait until a checkpoint exists
        if line.startswith("saved checkpoint"):
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode != 0 and "Traceback" not in err
    assert "train.py: interrupted at step" in err and f"--init_from=resume --out_dir={tmp_path}" in err
    assert (tmp_path / "ckpt.pt").exists() and not (tmp_path / "ckpt.pt.tmp").exists()


class SendsCtrlC:
    """Pickling it sends this process a SIGINT: a Ctrl-C that lands in the middle of writing a checkpoint."""
    def __reduce__(self):
        import signal
        os.kill(os.getpid(), signal.SIGINT)
        return (int, (7,))


def test_ctrl_c_mid_write_keeps_the_new_checkpoint(tmp_path):
    from plumbing.checkpoint import save_checkpoint
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, {"step": 1})
    with pytest.raises(KeyboardInterrupt):  # raised, but only once the new file is whole and in place
        save_checkpoint(path, {"step": 2, "weights": np.arange(10**6), "interrupt": SendsCtrlC(), "tail": [3] * 1000})
    import torch
    ckpt = torch.load(path, weights_only=False)
    assert ckpt["step"] == 2 and ckpt["interrupt"] == 7 and ckpt["tail"] == [3] * 1000
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def task_folder(root, name, labels):
    d = root / name
    d.mkdir()
    for split in ("train", "dev"):
        rows = ["sentence\tlabel"] + [f"sentence number {i}\t{y}" for i, y in enumerate(labels)]
        (d / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return d


@pytest.mark.parametrize("labels,message", [
    (["1"] * 10, "every label is '1'; a classification task needs at least two classes"),
    (["0.5", "nan", "1.5", "2.0"], "label 'nan' is not a finite number"),
    (["0", "1"] * 5 + ["yes"], "the labels mix numbers and words (0, 1, yes)"),
])
def test_probe_refuses_meaningless_tasks(labels, message, tmp_path, monkeypatch, capsys):
    task = task_folder(tmp_path, "task", labels)
    assert message in script_error(monkeypatch, capsys, "probe.py", "--ckpt=random", "--n_layer=1", "--n_embd=32",
                                   "--n_head=2", f"--tasks={task}")


@pytest.mark.parametrize("args,message", [
    (["--temperature=0"], "--temperature must be > 0"),
    (["--pairs=EMPTY"], "no pairs there"),
    (["--pairs=FEW"], "fewer pairs than one batch of 64"),
])
def test_embed_refuses_meaningless_training(args, message, tmp_path, shared_dir, monkeypatch, capsys):
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "few.tsv").write_text("".join(f"a{i}\tb{i}\n" for i in range(10)))
    args = [a.replace("EMPTY", str(tmp_path / "empty.tsv")).replace("FEW", str(tmp_path / "few.tsv")) for a in args]
    # in this process; the error follows the lines embed.py prints as it works, so it is the last line, not the only one
    monkeypatch.setattr(sys, "argv", ["embed.py", "--ckpt=random", "--n_layer=1", "--n_embd=32", "--n_head=2",
                                      f"--sts={shared_dir / 'glue' / 'STS-B'}", *args])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(os.path.join(ROOT, "embeddings", "embed.py"), run_name="__main__")
    assert e.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]


def test_non_finite_weights_are_caught_at_load(tmp_path):
    from plumbing.checkpoint import load_checkpoint, save_checkpoint
    from model import CrossBERT, ModelConfig
    model = CrossBERT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    state = model.state_dict()
    state["blocks.0.mlp.fc.weight"][0, 0] = float("inf")  # one flipped exponent
    save_checkpoint(tmp_path / "ckpt.pt", dict(model=state, model_type="crossbert", model_args=vars(model.config),
                                               vocab_map=None))
    with pytest.raises(ValueError, match="non-finite weights \\(blocks.0.mlp.fc.weight\\)"):
        load_checkpoint(tmp_path / "ckpt.pt")



# embed.py --texts: (files to write, arguments, a fragment of the expected message); {d} is the test's folder
TEXTS_CASES = [
    ({}, ["--texts={d}/no/such.txt"], "--texts={d}/no/such.txt: no such file"),
    ({}, ["--texts={d}"], "--texts={d}: a folder"),
    ({"in.txt": b"fine\ncaf\xe9 au lait\n"}, ["--texts={d}/in.txt"], "{d}/in.txt:2: not UTF-8 text (byte 0xe9 at column 4)"),
    ({"in.jsonl": b'{"text": "a"}\n{"body": "b"}\n'}, ["--texts={d}/in.jsonl"],
     "in.jsonl:2: expected a JSON object with the string fields ['text'] (found: body)"),
    ({"in.jsonl": b'{"text": "a"}\n'}, ["--texts={d}/in.jsonl", "--text_key=body"],
     "in.jsonl:1: expected a JSON object with the string fields ['body'] (found: text)"),
    ({"in.jsonl": b'{"text": "a"\n'}, ["--texts={d}/in.jsonl"], "in.jsonl:1: not valid JSON"),
    ({"in.txt": b""}, ["--texts={d}/in.txt"], "--texts={d}/in.txt: no text in it"),
    ({"in.txt": b"a\n"}, ["--texts={d}/in.txt", "--out_npy={d}/in.txt/out.npy"], "{d}/in.txt is a file, not a folder"),
    ({"in.txt": b"a\n"}, ["--texts={d}/in.txt", "--load_pooler={d}/none.pt"], "--load_pooler={d}/none.pt: no such file"),
    ({"in.txt": b"a\n", "p.pt": b"not a zip"}, ["--texts={d}/in.txt", "--load_pooler={d}/p.pt"],
     "p.pt is truncated or not a saved pooler"),
    ({"in.txt": b"a\n", "p.pt": "pooler64"}, ["--texts={d}/in.txt", "--load_pooler={d}/p.pt"],
     "p.pt is a pooler of 64 dims, but --ckpt=random has n_embd=32; pass the checkpoint it was trained on, big/ckpt.pt"),
]


@pytest.mark.parametrize("files,args,message", TEXTS_CASES, ids=[" ".join(a) for _, a, _ in TEXTS_CASES])
def test_embed_texts_bad_input_is_one_line(files, args, message, tmp_path):
    import embed
    from embeddings.vectors import AttentionPooler
    from conftest import assert_one_line_error
    from embeddings.vectors import save_pooler
    for name, content in files.items():
        if content == "pooler64":  # a real pooler file, for a wider backbone
            save_pooler(tmp_path / name, AttentionPooler(64, 2), "attn", 64, 2, "big/ckpt.pt")
        else:
            (tmp_path / name).write_bytes(content)
    before = set(tmp_path.iterdir())
    args = [a.format(d=tmp_path) for a in args]
    if not any(a.startswith("--out_npy") for a in args):
        args.append(f"--out_npy={tmp_path / 'out.npy'}")
    assert_one_line_error(embed.main, ["--ckpt=random", "--n_layer=1", "--n_head=2", "--n_embd=32", *args], "embed.py",
                          message.format(d=tmp_path))
    assert set(tmp_path.iterdir()) == before  # nothing written: no .npy, no temporary file


def test_embed_save_pooler_is_checked_before_training(tmp_path):
    import embed
    from conftest import assert_one_line_error
    (tmp_path / "sts.tsv").write_text("1\ta\tb\n2\tc\td\n")
    (tmp_path / "pairs.tsv").write_text("a\tb\n")
    before = set(tmp_path.iterdir())
    args = ["--ckpt=no/such/ckpt.pt", f"--sts={tmp_path / 'sts.tsv'}", f"--pairs={tmp_path / 'pairs.tsv'}",
            f"--save_pooler={tmp_path / 'pairs.tsv' / 'p.pt'}"]  # refused before the checkpoint is even read
    assert_one_line_error(embed.main, args, "embed.py", f"{tmp_path / 'pairs.tsv'} is a file, not a folder")
    assert set(tmp_path.iterdir()) == before
