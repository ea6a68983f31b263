"""
The ladder's next runs on one lent GPU, in a fixed wall time: the prepared command for a GPU machine that gets the
repository and a small pack of data, and gives back a few files.

    python experiments/ladder_gpu.py --make_pack --tasks=DIR/devtasks  # here, first: data/web, tasks -> ladder-pack/
    python experiments/ladder_gpu.py --out=$OUT           # there: trains what fits in 8 minutes, writes $OUT
    python experiments/ladder_gpu.py --out=$OUT --lr_scales=1,2   # each family at the law and at twice its rate
    python experiments/ladder_gpu.py --smoke --tasks=DIR/devtasks --out=/tmp/l   # the same path on the CPU, tiny
    python experiments/ladder_gpu.py --dry_run            # the runs it would train, in order

It trains the ladder runs (sweep.py's ladder preset: web text, block 128, the compact vocabulary, 20 training tokens
per BERT parameter, its learning-rate and batch laws, snapshots for the probes along training) that are not yet in
--results: seed 0 of each family at each rung first, then seeds 1, 2, ..., and ELECTRA's seeds last; with --lr_scales,
each seed's runs at every multiplier of the law's learning rate (sweep.py's lr axis) before the next seed's. --parallel
runs train at once (a small model leaves the GPU idle between its kernels), each with its share of the host's cores. The
command times the runs' first steps and decides from them what fits: a run starts only if its estimate (its steps at
its family's measured step time, the start-up and probes measured so far) ends before the deadline, and a run whose
measured pace would miss it is stopped. Each finished run is probed here, on the GPU, as the sweep probes it (the
final weights, its snapshots and its random twin, the devtasks at every layer), because checkpoints do not come back.

--out gets at most four files: results.jsonl (the records in the ladder's format, which pool with
experiments/results/ladder/results.jsonl), report.md and report.json (what ran, its step times and MFU, what did
not fit and why), and logs.txt (every run's train.log).

The pack (data/pack.py) is what travels beside the repository: the corpus as the compact vocabulary reads it and
the tasks' rows the probes use, 54 MiB (51.1 of them the corpus); unpacking checks the corpus against its hash.
--make_pack prepares data/web first if it is not prepared, from --corpus (e.g. --corpus="DIR/web/*.parquet").
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from configurator import UserError, configure, user_errors
from data.pack import pack_corpus, pack_tasks, unpack_corpus, unpack_tasks
from plumbing.checks import check_device, check_writable
from evaluation.features import random_twin
from report import Report
from runs import (PRESETS, ROOT, prepare_dataset, probe_model, read_families, read_log, read_lr_scales, run_record,
                  run_settings, size_budget, start, steps_for, tokenized_tasks, trajectory, twin_record)

settings = dict(
    out="",                   # the folder of what comes back (needed): results.jsonl, report.md/.json, logs.txt
    pack="ladder-pack",       # the corpus and tasks, packed to travel beside the repository
    make_pack=False,          # write --pack from data/<dataset> and --tasks, and stop (on this machine, before the GPU)
    dataset="web",            # --make_pack: the prepared corpus under data/ ...
    corpus="",                # ... prepared first from these files if it has none, e.g. "DIR/web/*.parquet"
    tasks="",                 # --make_pack and --smoke: the probes' task folders, or a folder of them (needed), e.g.
                              # DIR/devtasks
    minutes=8.0,              # the command's wall time, from its start to its last file
    sizes="6x384",            # the rungs, n_layer x n_embd (heads of 64 channels)
    seeds=3,                  # training seeds per family and rung
    families="bert-801010,crossbert,bert,electra",  # seed 0 of each first, then seed 1, ...; ELECTRA's seeds after the
                              # others'. bert-801010: BERT's 80/10/10, the baseline (sweep.py's replace axis); bert: all
                              # <mask>, the ladder's BERT before it
    lr_scales="1",            # multipliers of the law's learning rate (and min_lr) each family trains at, each seed's
                              # in this order: 1 = the ladder's main runs; others are the lr axis's runs (-lr<m> names),
                              # e.g. 1,2 for the law and each family's own rate where the grid chose x2
    parallel=3,               # runs training at once on the one device
    results="experiments/results/ladder/results.jsonl",  # the runs on record, not trained again ("" = none)
    max_train=2000,           # training examples per task for the probes, as the sweep's
    micro_batch=512,          # rows per micro-step, at most: a ladder step in one micro-step
    probe_s=45.0,             # seconds to probe one run (checkpoint, snapshots, twin) until one is measured
    work_dir="out-ladder",    # the runs' checkpoints, the unpacked corpus and tasks
    smoke=False,              # tiny rungs on the built-in corpus, packed and unpacked: checks the path
    dry_run=False,            # print the runs it would train, in order, and stop
    device="cuda" if torch.cuda.is_available() else "cpu",  # where the runs train and are probed
    compile=True,             # train.py's torch.compile (on one GPU: with CUDA graphs)
)
# tiny runs a busy 2-core CPU trains and probes well inside the deadline
SMOKE = dict(minutes=6.0, sizes="1x64", seeds=2, parallel=2, results="", max_train=200, micro_batch=16,
             compile=False, dataset="tinybooks", probe_s=20.0)
TINY_TOKENS_PER_PARAM = 0.05  # --smoke: a few dozen steps


def queue(s, p, sizes, done, lr_scales=(1.0,)):
    """[(name, family, settings, lr multiplier)] of the runs to train, in order: at each rung seed 0 of every family at
    each multiplier, then seed 1, ...; ELECTRA after the other families' seeds. Runs named in `done` are skipped."""
    families = read_families(s["families"], replace=True)
    runs = []
    for i, (L, C, H) in enumerate(sizes):
        order = sorted(((k, m, f) for k in range(s["seeds"]) for m in lr_scales for f in families),
                       key=lambda kmf: (kmf[2] == "electra", kmf[0], lr_scales.index(kmf[1]), families.index(kmf[2])))
        for k, m, fam in order:
            model_type, replace = fam.removesuffix("-801010"), fam.endswith("-801010")
            name = (f"{model_type}-{L}x{C}" + (f"-lr{m:g}" if m != 1 else "") + "-801010" * replace
                    + (f"-s{k}" if k else ""))  # sweep.py's names
            if name not in done:
                rs = run_settings(p, L, C, H, model_type, size_budget(p, i), seed=1337 + k,
                                  **dict(random_replace=True) if replace else {})
                rs.update(learning_rate=rs["learning_rate"] * m, min_lr=rs["min_lr"] * m)
                runs.append((name, fam, rs, m))
    return runs


def progress(run_dir):
    """(seconds per step, steps left) of a run so far: the median of its logged step times after the first (which
    holds compilation and CUDA-graph capture); None before two are logged."""
    try:
        log = read_log(run_dir)
    except (FileNotFoundError, json.JSONDecodeError):  # not started yet, or a line half written
        return None
    times = [x["ms_per_step"] / 1000 for x in log if "ms_per_step" in x][1:]
    return (statistics.median(times), log[0]["max_iters"] - max(x["step"] for x in log)) if times else None


def finish_times(now, train_ends, probe_s):
    """When each run is probed, given when each ends training: one run is probed at a time, in order of ending."""
    t, out = now, {}
    for name, end in sorted(train_ends.items(), key=lambda kv: kv[1]):
        t = max(t, end) + probe_s
        out[name] = t
    return out


def too_late(now, train_ends, probe_s, deadline):
    """{run: when it would be probed} of the runs to stop so that the others are probed by the deadline: the run that
    would be probed last goes first, and the others' probes then queue behind one fewer."""
    ends, stop = dict(train_ends), {}
    while ends:
        times = finish_times(now, ends, probe_s)
        run = max(times, key=times.get)
        if times[run] <= deadline:
            break
        stop[run] = times[run]
        del ends[run]
    return stop


def flat(scores):
    """probe_model's {task: {linear, knn}, linear_avg, knn_avg} as a sweep record's {"TASK/linear": %, ...}."""
    out = {}
    for key, value in scores.items():
        out.update({f"{key}/{p}": value[p] for p in ("linear", "knn")} if isinstance(value, dict) else {key: value})
    return out


def probe_run(name, rs, lr_scale, run_dir, s, twins):
    """The run's record and its twin's, probed at every layer (the sweep's format without GLUE and STS). The twin
    (the run's initial weights, shared by its seed's runs at every multiplier) is probed once: `twins` {name: record}
    holds those on record or probed already, and gets this one."""
    t0 = time.time()
    every = list(range(rs["n_layer"] + 1))
    layered = lambda b: {str(k): flat(v) for k, v in probe_model(b, s["task_data"], 64, every).items()}
    axis = "replace" if rs.get("random_replace") else "main" if lr_scale == 1 else "lr"  # sweep.py's axes
    r, backbone = run_record(name, axis, rs, run_dir, s["device"], lr_scale=lr_scale)
    r["layers"] = layered(backbone)
    r["scores"] = r["layers"][str(rs["n_layer"])]
    r["trajectory"] = trajectory(run_dir, s["device"], layered)
    twin = twin_record(rs, r["seed"], backbone)
    new = twin["name"] not in twins
    if new:
        twin["layers"] = layered(random_twin(backbone, rs["seed"]))
        twin["scores"] = twin["layers"][str(rs["n_layer"])]
        twins[twin["name"]] = twin
    return r, twins[twin["name"]], new, time.time() - t0


def pace(log):
    """A run's median step time (ms) and MFU (%) from its log, past the first logged interval."""
    steps = [x for x in log if "ms_per_step" in x][1:]
    if not steps:
        return "-", "-"
    return (f"{statistics.median(x['ms_per_step'] for x in steps):.1f}",
            f"{100 * statistics.median(x['mfu'] for x in steps):.1f}")


def make_pack(s):
    if not s["tasks"]:
        raise UserError("--tasks is needed: the probes' task folders (train.tsv, dev.tsv) to pack, or a folder of "
                        "them, e.g. --tasks=DIR/devtasks")
    check_writable(s["pack"], "--pack")
    prepare_dataset(s["dataset"], s["corpus"])
    os.makedirs(s["pack"], exist_ok=True)
    info = pack_corpus(os.path.join(ROOT, "data", s["dataset"]), 8192, s["pack"])
    pack_tasks(s["tasks"], s["max_train"], s["pack"])
    sizes = {f: os.path.getsize(os.path.join(s["pack"], f)) for f in sorted(os.listdir(s["pack"]))}
    print(f"ladder_gpu: packed data/{s['dataset']} ({info['tokens']['train']:,} training tokens) and {s['tasks']} "
          f"into {s['pack']}/: " + ", ".join(f"{f} {n / 2**20:.1f} MiB" for f, n in sizes.items())
          + f"; {sum(sizes.values()) / 2**20:.1f} MiB in all")


def main(argv):
    s = configure(settings, argv, help_from=[__file__])
    t_start = time.time()
    if s["smoke"]:
        given = {a.split("=")[0] for a in argv}
        s.update({k: v for k, v in SMOKE.items() if f"--{k}" not in given})
        if "--pack" not in given:
            s["pack"] = os.path.join(s["work_dir"], "pack")
    if s["make_pack"]:
        return make_pack(s)
    # every input checked before anything is written
    try:
        sizes = [(int(L), int(C), int(C) // 64) for L, C in (x.split("x") for x in s["sizes"].split(","))]
    except ValueError:
        raise UserError(f"--sizes={s['sizes']}: expected n_layer x n_embd pairs, e.g. 6x384,8x512") from None
    if any(C % 64 for _, C, _ in sizes):
        raise UserError(f"--sizes={s['sizes']}: widths must be multiples of 64 (heads of 64 channels)")
    read_families(s["families"], replace=True)
    lr_scales = read_lr_scales(s["lr_scales"], "1,2")
    check_device(s["device"])
    on_record = {}
    if s["results"]:
        with open(s["results"]) as f:
            on_record = {r["name"]: r for r in map(json.loads, f)}
    data_dir = os.path.abspath(os.path.join(s["work_dir"], "data"))
    p = dict(PRESETS["ladder"], sizes=sizes, flops=[0] * len(sizes), dataset=data_dir, micro_batch=s["micro_batch"])
    if s["smoke"]:
        p["tokens_per_param"] = TINY_TOKENS_PER_PARAM
    todo = queue(s, p, sizes, on_record, lr_scales)
    if s["dry_run"]:
        for run, fam, rs, _ in todo:
            steps, per_step = steps_for(rs)
            print(f"{run:22s} {steps:6d} steps x {rs['total_batch_size']:6d} tokens ({rs['total_batch_size'] // 128} "
                  f"rows) = {steps * rs['total_batch_size'] / 1e6:.0f}M input tokens, {steps * per_step:.2e} FLOPs, "
                  f"lr {rs['learning_rate']:.2e}")
        return
    if not s["out"]:
        raise UserError("--out is needed: the folder for results.jsonl, report.md and logs.txt")
    check_writable(s["out"], "--out")
    check_writable(s["work_dir"], "--work_dir")
    if s["smoke"]:
        make_pack(s)
    if not os.path.isfile(os.path.join(s["pack"], "corpus.json")):
        raise UserError(f"--pack={s['pack']} holds no pack; write one with python experiments/ladder_gpu.py "
                        "--make_pack, and carry it to this machine")
    deadline = t_start + 60 * s["minutes"]
    os.makedirs(s["out"], exist_ok=True)
    unpack_corpus(s["pack"], data_dir)
    s["task_data"] = tokenized_tasks(unpack_tasks(s["pack"], os.path.join(s["work_dir"], "devtasks")),
                                     s["max_train"], 128)
    name = torch.cuda.get_device_name(s["device"]) if s["device"].startswith("cuda") else "cpu"
    threads = max(1, (os.cpu_count() or 1) // s["parallel"])
    report = Report(os.path.join(s["out"], "report.md"), (
        f"# The ladder on {name}\n\n{time.strftime('%Y-%m-%d')}, torch {torch.__version__}; `python "
        f"experiments/ladder_gpu.py {' '.join(argv)}`: {s['minutes']:g} minutes, {s['parallel']} runs at once "
        f"({threads} host threads each). Planned, in order: {', '.join(n for n, *_ in todo) or 'nothing'}."
        + ("\n\n**Smoke run**: tiny rungs on the built-in corpus; it checks the path and measures nothing."
           if s["smoke"] else "")))
    report.add("setup (pack unpacked and checked, tasks tokenized)", time.time() - t_start, None)
    extra = dict(eval_interval=p["eval_interval"], snapshots=p["snapshots"], checkpoint_evals=False,
                 device=s["device"], overwrite=True)
    started, running = {}, {}  # run -> {fam, rs, lr_scale, dir, proc, t0}: every run started, and those still training
    twins = {n: r for n, r in on_record.items() if r.get("axis") == "random"}  # probed once per family, shape and seed
    measured = dict(start_s=[], probe_s=[])  # of the finished runs: seconds outside their steps, and probing them
    results_path = os.path.join(s["out"], "results.jsonl")

    def rate(fam, rs):
        """Seconds per step of a run not started: its family's measured pace, else another family's scaled by the
        FLOPs of a step; None before any run has logged its pace."""
        paces = {r["fam"]: (got[0], r["rs"]) for r in started.values() if (got := progress(r["dir"]))}
        if fam in paces:
            return paces[fam][0]
        if paces:
            t, other = next(iter(paces.values()))
            return t * steps_for(rs)[1] / steps_for(other)[1]
        return None

    def note(run, text, seconds=0.0, data=None):
        report.add(run, seconds, f"- **{run}**: {text}", data)
        print(f"ladder_gpu: {run}: {text}", flush=True)

    while todo or running:
        # a finished run is probed here and recorded; a failed one is reported
        for run, r in list(running.items()):
            if r["proc"].poll() is None:
                continue
            del running[run]
            if r["proc"].returncode:
                note(run, f"failed (exit {r['proc'].returncode}); its train.log is in logs.txt")
                continue
            train_s = time.time() - r["t0"]
            record, twin, new_twin, probe_s = probe_run(run, r["rs"], r["lr_scale"], r["dir"], s, twins)
            measured["start_s"].append(train_s - record["steps"] * (progress(r["dir"]) or (0,))[0])
            measured["probe_s"].append(probe_s)
            record.update(train_s=round(train_s, 1), probe_s=round(probe_s, 1))
            with open(results_path, "a") as f:
                f.write(json.dumps(record) + "\n" + (json.dumps(twin) + "\n" if new_twin else ""))
            ms, mfu = pace(read_log(r["dir"]))
            note(run, f"{record['steps']} steps in {train_s:.0f} s ({ms} ms a step, MFU {mfu}%, {len(running) + 1} "
                      f"runs training), val loss {record['val_loss']:.3f} (unigram {record['unigram_loss']:.3f}); "
                      f"linear {record['scores']['linear_avg']:.1f} (twin {twin['scores']['linear_avg']:.1f}), kNN "
                      f"{record['scores']['knn_avg']:.1f} (twin {twin['scores']['knn_avg']:.1f}); probed in "
                      f"{probe_s:.0f} s", train_s + probe_s, dict(ms_per_step=ms, mfu=mfu, val_loss=record["val_loss"]))
        now = time.time()
        probe_s = max(measured["probe_s"], default=s["probe_s"])
        start_s = max(measured["start_s"], default=0.0)
        # a run whose pace would have it probed past the deadline (probes queue behind each other) is stopped
        ends = {run: now + got[0] * got[1] if (got := progress(r["dir"])) else now  # no pace yet: at least its probes
                for run, r in running.items()}
        for run, end in too_late(now, ends, probe_s, deadline).items():
            ends.pop(run)
            r = running.pop(run)
            r["proc"].kill()
            r["proc"].wait()
            note(run, f"stopped at {now - t_start:.0f} s: at its pace it would be probed by {end - t_start:.0f} s, "
                      f"past the {deadline - t_start:.0f} s deadline")
        # the next runs start while their estimates fit; the first ones start before anything is measured
        while todo and len(running) < s["parallel"]:
            run, fam, rs, lr_scale = todo.pop(0)
            t = rate(fam, rs)
            if t is not None:
                finish = finish_times(now, {**ends, run: now + start_s + steps_for(rs)[0] * t}, probe_s)[run]
                if finish > deadline:
                    note(run, f"not started at {now - t_start:.0f} s: its estimate ({steps_for(rs)[0]} steps at "
                              f"{1000 * t:.1f} ms, {start_s:.0f} s to start, {probe_s:.0f} s of probes) ends by "
                              f"{finish - t_start:.0f} s, past the {deadline - t_start:.0f} s deadline")
                    continue
            run_dir = os.path.join(s["work_dir"], run)
            started[run] = running[run] = dict(fam=fam, rs=rs, lr_scale=lr_scale, dir=run_dir, t0=time.time(),
                                               proc=start({**rs, **extra}, run_dir, 1, s["compile"], threads))
            print(f"ladder_gpu: started {run} at {time.time() - t_start:.0f} s", flush=True)
        time.sleep(0.5 if running else 0)

    with open(os.path.join(s["out"], "logs.txt"), "w") as out:
        for run in sorted(os.listdir(s["work_dir"])):
            path = os.path.join(s["work_dir"], run, "train.log")
            if os.path.isfile(path):
                with open(path) as f:
                    out.write(f"==> {run}/train.log <==\n{f.read()}\n")
    report.add("done", time.time() - t_start, None)
    print(f"ladder_gpu: wrote {s['out']}: results.jsonl, report.md, report.json, logs.txt "
          f"({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    with user_errors("ladder_gpu.py"):
        main(sys.argv[1:])
