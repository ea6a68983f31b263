"""
The experiments' reports. The sweep's, from its results.jsonl records: results.md (trained against random init, the
crossing, the families at equal FLOPs, every run) and, with matplotlib (optional: pip install matplotlib), the plots.
The GPU runs' (acceptance.py, ladder_gpu.py): a markdown file and its JSON twin, rewritten as each part ends.
"""
import json
import os

import numpy as np

from plumbing.checks import optional
from flops import head_share, param_counts
from configurator import make_config
from model import MODELS
from stats import fmt, fmt_ratio, interval, trend, verdict


PROBES = (("linear_avg", "linear"), ("knn_avg", "kNN"))
BASELINE = "bert 80/10/10"  # BERT's own corruption (the replace axis): the stronger BERT, so the baseline (LOG.md)
COMPARISONS = (("crossbert", BASELINE), ("crossbert", "bert"), ("electra", BASELINE), ("electra", "bert"),
               ("crossbert", "electra"))  # family − baseline; "bert": all <mask>, the ladder's BERT before 80/10/10


def family(r):
    """A record's family: its model_type, or BASELINE for a BERT with the 80/10/10 corruption."""
    return BASELINE if r["model_type"] == "bert" and r["settings"].get("random_replace") else r["model_type"]


def seed_of(r):
    return r.get("seed", 0)


def shape_of(r):
    return r.get("shape") or f"{r['settings']['n_layer']}x{r['settings']['n_embd']}"


def init_diffs(rs, twins, key):
    """trained − init on score `key` for each run of rs whose twin (its family's, shape's and seed's random run)
    is in twins, a dict (family, shape) -> {seed: scores}."""
    return [r["scores"][key] - twins[r["model_type"], shape_of(r)][seed_of(r)][key] for r in rs
            if seed_of(r) in twins.get((r["model_type"], shape_of(r)), {})]


def trend_cell(pairs):
    """stats.trend's slope as a table cell, "slope [95% interval]" (points per doubling); None where it has none."""
    fit = trend(pairs)
    return fit and f"{fit[0]:+.2f} [{fit[0] - fit[1]:+.2f}, {fit[0] + fit[1]:+.2f}]"


def crossing(rs, twins, key):
    """One row of the crossing table for a family's main runs rs: the first budget where trained beats its random
    twins (paired by seed, the interval above 0), and the trend of trained − init over budgets."""
    by_budget = {}
    for r in rs:
        by_budget.setdefault(r["settings"]["max_flops"], []).append(r)
    diffs = {b: d for b, runs in sorted(by_budget.items()) if (d := init_diffs(runs, twins, key))}
    first = next((b for b, d in diffs.items() if verdict(d) == "above"), None)
    reached = f"{first:.2e} ({fmt(diffs[first], True)})" if first else "not reached"
    fit = trend([(b, x) for b, d in diffs.items() for x in d])
    if fit is None:
        return [reached, "one budget: no trend yet", "-"]
    slope, hw, x0, x0_hw = fit
    if first:
        where = "-"
    elif slope - hw <= 0:
        where = "no rise beyond its interval: not extrapolated"
    elif x0 + x0_hw < 1000:  # FLOPs as a number while a float holds them
        where = f"{2 ** x0:.1e} [{2 ** (x0 - x0_hw):.1e}, {2 ** (x0 + x0_hw):.1e}]"
    else:
        where = f"2^{x0:.0f} [2^{x0 - x0_hw:.0f}, 2^{x0 + x0_hw:.0f}]"
    return [reached, f"{slope:+.2f} [{slope - hw:+.2f}, {slope + hw:+.2f}]", where]


def summarize(results):
    """The sweep's answer, as markdown: each main cell against its random twins, and the families against each other
    at equal FLOPs, on the primary average (linear_avg, knn_avg). Differences are paired by training seed: a run
    against its own initial weights (the twin of the same seed), CrossBERT seed k against BERT seed k (the same
    data order). Intervals are 95% Student-t intervals of the mean difference over seeds; mean ± sd elsewhere."""
    main = [r for r in results if r["axis"] == "main"]
    twins = {}  # (family, shape) -> {seed: scores}
    for r in results:
        if r["axis"] == "random":
            twins.setdefault((r["model_type"], shape_of(r)), {})[seed_of(r)] = r["scores"]
    cells = {}
    for r in main:
        cells.setdefault(r.get("cell", r["name"]), []).append(r)
    lines = ["## Trained against random init", "",
             "Primary average (linear / kNN probes), mean ± sd over training seeds; random init: the twins of that "
             "family and shape (twin k = training seed k's initial weights); trained − init paired by seed, "
             "[95% interval].", "",
             "| cell | train FLOPs | seeds | val loss | unigram | linear | init linear | trained − init | kNN | "
             "init kNN | trained − init | verdict (linear / kNN) |", "|" + "---|" * 12]
    for name, rs in sorted(cells.items(), key=lambda kv: (kv[1][0]["model_type"], kv[1][0]["flops"])):
        tw = twins.get((rs[0]["model_type"], shape_of(rs[0])), {})
        row = [name, f"{np.mean([r['flops'] for r in rs]):.2e}", str(len(rs)), fmt([r["val_loss"] for r in rs], places=3),
               f"{rs[0]['unigram_loss']:.3f}"]
        verdicts = []
        for key in ("linear_avg", "knn_avg"):
            paired = init_diffs(rs, twins, key)
            row += [fmt([r["scores"][key] for r in rs]), fmt([t[key] for t in tw.values()]) if tw else "-",
                    fmt(paired, signed=True) if paired else "-"]
            verdicts.append(verdict(paired) if paired else "-")
        lines.append("| " + " | ".join(row + [" / ".join(verdicts)]) + " |")
    lines += ["", "## The crossing", "", "The smallest budget at which a family's trained runs beat their random twins "
              "(the 95% interval of trained − init above 0), and the least-squares trend of trained − init against "
              "log2 FLOPs (every seed a point) in points per doubling, [95% interval]; where no budget beats the "
              "twins yet and the trend rises, the FLOPs where the line reaches 0 (an extrapolation, [95% range]).", "",
              "| family | probe | beats its twins from | trend per doubling | extrapolated crossing (FLOPs) |",
              "|" + "---|" * 5]
    for fam in sorted({r["model_type"] for r in main}):
        rs = [r for r in main if r["model_type"] == fam]
        for key, probe in (("linear_avg", "linear"), ("knn_avg", "kNN")):
            lines.append("| " + " | ".join([fam, probe] + crossing(rs, twins, key)) + " |")
    own_rate = (" BERT 80/10/10, the baseline, ran at its own learning rate: its comparisons are under \"Each family "
                "at its own learning rate\"." if any(r["axis"] == "replace" for r in results) else "")
    lines += ["", "## Families at equal FLOPs", "", "CrossBERT minus each baseline, and ELECTRA minus BERT, at the same "
              "budget and shape, paired by training seed, [95% interval]. Here bert is the main runs' all-<mask> BERT, "
              "at the law's learning rate." + own_rate, "",
              "| budget | shape | comparison | seeds | linear | kNN | verdict (linear / kNN) |", "|" + "---|" * 7]
    budgets = {}
    for r in main:
        budgets.setdefault((r["settings"]["max_flops"], shape_of(r)), {}).setdefault(r["model_type"], {})[seed_of(r)] = r
    points = {}  # (family, baseline, probe key) -> [(budget, difference)], every seed pair of every budget
    for (budget, shp), fams in sorted(budgets.items()):
        for fam, ref in COMPARISONS:
            common = sorted(set(fams.get(fam, ())) & set(fams.get(ref, ())))
            if not common:
                continue
            diffs = {key: [fams[fam][k]["scores"][key] - fams[ref][k]["scores"][key] for k in common]
                     for key in ("linear_avg", "knn_avg")}
            lines.append(f"| {budget:.2e} | {shp} | {fam} − {ref} | {len(common)} | {fmt(diffs['linear_avg'], True)} | "
                         f"{fmt(diffs['knn_avg'], True)} | {verdict(diffs['linear_avg'])} / {verdict(diffs['knn_avg'])} |")
            for key, d in diffs.items():
                points.setdefault((fam, ref, key), []).extend((budget, x) for x in d)
    # whether a family's lead grows with compute (the paper's claim) or shrinks: the same differences across budgets
    trends = []
    for fam, ref in COMPARISONS:
        for key, probe in PROBES:
            pairs = points.get((fam, ref, key), [])
            if cell := trend_cell(pairs):
                trends.append(f"| {fam} − {ref} | {probe} | {len(pairs)} | {cell} |")
    if trends:
        lines += ["", "Each difference against training FLOPs across the budgets: the least-squares trend against log2 "
                  "FLOPs (every seed pair a point) in points per doubling, [95% interval].", "",
                  "| comparison | probe | pairs | trend per doubling |", "|" + "---|" * 4, *trends]
    return "\n".join(lines) + "\n"


def cells_of(results, key):
    """{cell: its main runs that hold `key` (layers, trajectory)}, in the order of (family, FLOPs)."""
    cells = {}
    for r in sorted((r for r in results if r["axis"] == "main" and key in r), key=lambda r: (r["model_type"], r["flops"])):
        cells.setdefault(r.get("cell", r["name"]), []).append(r)
    return cells


def layer_table(results):
    """The markdown table of each cell's primary averages by layer (0 = the token embeddings), mean over seeds; its best
    layer; and paired by seed: last − best, last − layer 0 (what context adds), the twins' last − layer 0, and
    trained − twin at the last layer."""
    twins = {(r["model_type"], shape_of(r), seed_of(r)): r for r in results if r["axis"] == "random" and "layers" in r}
    lines = ["| cell | seeds | probe | by layer, 0 (embeddings) to last | best layer | last − best | last − layer 0 | "
             "twins: last − layer 0 | trained − twin (last layer) |", "|" + "---|" * 9]
    for cell, rs in cells_of(results, "layers").items():
        n = len(rs[0]["layers"])
        last = str(n - 1)
        for key, probe in PROBES:
            by = np.array([[r["layers"][str(i)][key] for i in range(n)] for r in rs])  # seeds x layers
            best = int(np.argmax(by.mean(0)))
            tw = [twins[r["model_type"], shape_of(r), seed_of(r)] for r in rs
                  if (r["model_type"], shape_of(r), seed_of(r)) in twins]
            lines.append("| " + " | ".join([
                cell, str(len(rs)), probe, " / ".join(f"{v:.1f}" for v in by.mean(0)), str(best),
                fmt(list(by[:, -1] - by[:, best]), True), fmt(list(by[:, -1] - by[:, 0]), True),
                fmt([t["layers"][last][key] - t["layers"]["0"][key] for t in tw], True) if tw else "-",
                fmt([r["layers"][last][key] - t["layers"][last][key] for r, t in zip(rs, tw)], True)
                if len(tw) == len(rs) else "-"]) + " |")
    return "\n".join(lines) + "\n"


def trajectory_points(rs, twins):
    """The probes along training of one cell's runs: [(step, FLOPs, input tokens, [val losses], {key: [last-layer
    scores]}, {key: [best-layer scores]})], one point per snapshot step common to every seed, then the end of the
    runs; the twins (initial weights) first, at step 0."""
    def point(xs):  # xs: (val loss, {layer: scores}) per seed
        best = lambda layers, key: max(v[key] for v in layers.values())
        last = lambda layers: layers[str(len(layers) - 1)]
        return ([x[0] for x in xs], {k: [last(x[1])[k] for x in xs] for k, _ in PROBES},
                {k: [best(x[1], k) for x in xs] for k, _ in PROBES})
    points = []
    if twins:
        points.append((0, 0.0, 0, *point([(None, t["layers"]) for t in twins])))
    steps = set.intersection(*({p["step"] for p in r["trajectory"]} for r in rs))
    for step in sorted(steps):
        ps = [next(p for p in r["trajectory"] if p["step"] == step) for r in rs]
        points.append((step, ps[0]["flops"], ps[0]["tokens"], *point([(p["val_loss"], p["layers"]) for p in ps])))
    points.append((rs[0]["steps"], rs[0]["flops"], rs[0]["tokens"], *point([(r["val_loss"], r["layers"]) for r in rs])))
    return points


def trajectory_table(results):
    """The markdown table of each cell's probes along training (last and best layer, mean ± sd over seeds) with the
    val loss at the same point; FLOPs 0 is the random twins, the start of every run."""
    twins = {}
    for r in results:
        if r["axis"] == "random" and "layers" in r:
            twins.setdefault((r["model_type"], shape_of(r)), []).append(r)
    lines = ["| cell | seeds | step | fraction of the budget | train FLOPs | input tokens | val loss | linear (last) | "
             "kNN (last) | linear (best layer) | kNN (best layer) |", "|" + "---|" * 11]
    for cell, rs in cells_of(results, "trajectory").items():
        for step, flops, tokens, vals, last, best in trajectory_points(rs, twins.get((rs[0]["model_type"], shape_of(rs[0])))):
            lines.append("| " + " | ".join([
                cell, str(len(last["linear_avg"])), str(step), f"{flops / rs[0]['flops']:.3g}", f"{flops:.2e}",
                f"{tokens:,}", fmt(vals, places=3) if vals[0] is not None else "- (init)",
                *(fmt(last[k]) for k, _ in PROBES), *(fmt(best[k]) for k, _ in PROBES)]) + " |")
    return "\n".join(lines) + "\n"


def lr_scale_of(r):
    """A run's multiple of the power law's learning rate: the main axis's runs, and records from before the lr axis
    (which have no lr_scale), are the law's own, x1."""
    return r.get("lr_scale", 1.0)


def grid_means(grid, value):
    """{multiplier: mean value(record)} of grid ({multiplier: {seed: record}}) over the seeds every multiplier has, so
    that a one-seed grid beside three seeds of x1 compares seed 0 alone; {} when the multipliers share no seed."""
    common = set.intersection(*(set(runs) for runs in grid.values()))
    return {m: np.mean([value(runs[k]) for k in common]) for m, runs in grid.items()} if common else {}


def choose(grid, value, best):
    """The multiplier of grid whose mean value(record) over the common seeds (grid_means) is best (best: min or max);
    None when the multipliers share no seed."""
    means = grid_means(grid, value)
    return best(means, key=means.get) if means else None


def smoothed_optimum(grid):
    """The multiplier at the vertex of the parabola in log2(multiplier) through grid's lowest mean val loss (over the
    seeds every multiplier has) and its two neighbours: an optimum between the grid's points, as a smoothed loss
    picks it; None where the lowest is at the grid's edge (the grid does not bracket it) or the seeds share none."""
    means = grid_means(grid, lambda r: r["val_loss"])
    ms = sorted(means)
    loss = [means[m] for m in ms]
    i = int(np.argmin(loss)) if loss else 0
    if not 0 < i < len(ms) - 1:
        return None
    a, b, _ = np.polyfit(np.log2(ms[i - 1:i + 2]), loss[i - 1:i + 2], 2)
    return float(2 ** (-b / (2 * a))) if a > 0 else None


def lr_laws(chosen):
    """Each family's learning-rate law from its chosen multipliers of the shared law, {(budget, shape, family):
    multiplier or None}: {family: (its picks {budget: multiplier}, F0, m0, d)}, the multiplier m(F) = m0 * (F / F0)**d
    by least squares of log m on log F over its budgets (F0 the smallest; d = 0 from one budget)."""
    picks = {}
    for (budget, _, fam), m in chosen.items():
        if m is not None:
            picks.setdefault(fam, {})[budget] = m
    laws = {}
    for fam, by in picks.items():
        F = np.array(sorted(by))
        logm = np.log([by[f] for f in F])
        d, log_m0 = np.polyfit(np.log(F / F[0]), logm, 1) if len(F) > 1 else (0.0, logm[0])
        laws[fam] = (by, F[0], float(np.exp(log_m0)), float(d))
    return laws


def law_at(results, grids, fam, F0, m0, d):
    """What the law m(F) = m0 * (F / F0)**d gives at every rung fam has main runs at, as "<shape> x<multiplier>; ...",
    with the lr axis's command at a rung without a grid (grids: lr_grids())."""
    at = []
    for budget, shp in sorted({(r["settings"]["max_flops"], shape_of(r)) for r in results
                               if r["axis"] == "main" and r["model_type"] == fam}):
        m = float(f"{m0 * (budget / F0) ** d:.2g}")
        untried = (budget, shp, fam) not in grids and m != 1
        at.append(f"{shp} x{m:g}" + (f" (`--axes=lr --budgets={budget:.2g} --families={fam} --lr_scales={m:g}`)"
                                      .replace("e+", "e") if untried else ""))
    return "; ".join(at)


def lr_grids(results):
    """{(budget, shape, family): {multiplier: {seed: record}}} of the main, lr and replace axes, for the families the
    lr axis ran at that budget and shape (the main runs are its x1), and BERT 80/10/10 at the multipliers it ran at."""
    grids = {}
    for r in results:
        if r["axis"] in ("main", "lr", "replace"):
            key = (r["settings"]["max_flops"], shape_of(r), family(r))
            grids.setdefault(key, {}).setdefault(lr_scale_of(r), {})[seed_of(r)] = r
    return {key: g for key, g in grids.items() if len(g) > 1 or 1.0 not in g}


def own_lr(results):
    """Each family at its own learning rate, as markdown; "" without runs of the lr axis. The fixed rule: each family
    takes, at each budget and shape, the multiplier of the power law's learning rate with the lowest mean val loss of
    its own (choose(), over the seeds every multiplier has); the multiplier the linear probe would pick by the same
    rule is shown beside it, a sensitivity, not the choice. Then each family minus its baseline at equal FLOPs, paired
    by seed, at the law's learning rate (x1: the main axis, every seed) and at the chosen ones, and the trend of
    those differences per doubling of parameters (BERT's at each shape, the sizes' axis) both ways."""
    grids = lr_grids(results)
    if not grids:
        return ""
    lines = ["| budget | shape | family | lr multiplier | seeds | val loss | linear | kNN | chosen (val loss) | "
             "by linear |", "|" + "---|" * 10]
    chosen = {}
    for (budget, shp, fam), grid in sorted(grids.items()):
        chosen[budget, shp, fam] = choose(grid, lambda r: r["val_loss"], min)
        by_linear = choose(grid, lambda r: r["scores"]["linear_avg"], max)
        for m, runs in sorted(grid.items()):
            rs = [runs[k] for k in sorted(runs)]
            probes = [fmt([r["scores"][key] for r in rs]) for key, _ in PROBES]
            marks = ["yes" if m == pick else "-" for pick in (chosen[budget, shp, fam], by_linear)]
            lines.append(" | ".join([f"| {budget:.2e}", shp, fam, f"x{m:g}", ", ".join(map(str, sorted(runs))),
                                     fmt([r["val_loss"] for r in rs], places=3), *probes, *marks]) + " |")
    lines += ["", "Each family's own law, from its choices: the multiplier of the shared law as m(F) = m0 x (F / F0)^d, "
              "least squares in log-log over the budgets with a grid (d = 0 from one budget: a constant multiple), and "
              "what it gives at every budget the family has main runs at; a budget without a grid gets the lr axis's "
              "command that trains it there. Beside the choices, a sensitivity: the smoothed optimum, the vertex of "
              "the parabola in log2 of the multiplier through the lowest mean val loss and its two neighbours (- where "
              "the lowest is at the grid's edge), and the same law fitted to those vertices (the paper picks its optima "
              "by smoothed loss).", "",
              "| family | chosen (budget: multiplier) | smoothed optimum | m0 at F0 | d | at each budget: multiplier "
              "(command where untried) | the smoothed optima's law: d, at each budget |", "|" + "---|" * 7]
    vertices = {key: smoothed_optimum(g) for key, g in grids.items()}
    smoothed = lr_laws(vertices)
    for fam, (picks, F0, m0, d) in sorted(lr_laws(chosen).items()):
        tops = [f"{b:.2e}: " + (f"x{v:.2g}" if v else "-") for (b, _, f), v in sorted(vertices.items()) if f == fam]
        law = smoothed.get(fam)
        lines.append(f"| {fam} | {', '.join(f'{b:.2e}: x{m:g}' for b, m in sorted(picks.items()))} | "
                     f"{', '.join(tops)} | {m0:.3g} at {F0:.2e} | {round(d, 3) + 0:+.3f} | "  # + 0: no "-0.000"
                     f"{law_at(results, grids, fam, F0, m0, d)} | "
                     + (f"{round(law[3], 3) + 0:+.3f}: {law_at(results, grids, fam, *law[1:])} |" if law else "- |"))
    lines += ["", "Each family minus its baseline at equal FLOPs, paired by seed, [95% interval]: at the power law's "
              "learning rate (x1) and at each family's chosen multiplier.", "",
              "| budget | shape | comparison | learning rates | multipliers | pairs | linear | kNN | verdict (linear / "
              "kNN) |", "|" + "---|" * 9]
    points = {}  # (family, baseline, which learning rates, probe key) -> [(BERT's parameters, difference)]
    for (budget, shp, fam), grid in sorted(grids.items()):
        for ref in (ref for f, ref in COMPARISONS if f == fam and (budget, shp, ref) in grids):
            other = grids[budget, shp, ref]
            for way, (m, m_ref) in (("the law (x1)", (1.0, 1.0)),
                                    ("each its own", (chosen[budget, shp, fam], chosen[budget, shp, ref]))):
                a, b = grid.get(m, {}), other.get(m_ref, {})
                common = sorted(set(a) & set(b))
                if not common:
                    continue
                diffs = {key: [a[k]["scores"][key] - b[k]["scores"][key] for k in common] for key, _ in PROBES}
                lines.append(f"| {budget:.2e} | {shp} | {fam} − {ref} | {way} | x{m:g} / x{m_ref:g} | {len(common)} | "
                             f"{fmt(diffs['linear_avg'], True)} | {fmt(diffs['knn_avg'], True)} | "
                             f"{verdict(diffs['linear_avg'])} / {verdict(diffs['knn_avg'])} |")
                for key, d in diffs.items():
                    points.setdefault((fam, ref, way, key), []).extend((rung_params(a[common[0]]), x) for x in d)
    trends = [f"| {fam} − {ref} | {way} | {dict(PROBES)[key]} | {len(pairs)} | {cell} |"
              for (fam, ref, way, key), pairs in points.items() if (cell := trend_cell(pairs))]
    if trends:
        lines += ["", "Those differences against model size: the least-squares trend against log2 of BERT's parameters "
                  "at each shape (every seed pair a point) in points per doubling, [95% interval].", "",
                  "| comparison | learning rates | probe | pairs | trend per doubling of parameters |",
                  "|" + "---|" * 5, *sorted(trends)]
    return "\n".join(lines) + "\n"


def replace_table(results):
    """BERT with the 80/10/10 corruption (the replace axis) against all-<mask> BERT at the same learning-rate multiplier,
    and CrossBERT at its own chosen rate against each, paired by seed at equal FLOPs; "" without runs of the axis. A
    row: the seeds, each side's val loss beside the unigram loss (80/10/10's validation keeps its rule, so a tenth of
    its targets stand unchanged in the input: its loss does not compare with all-<mask>'s), linear and kNN (mean ± sd;
    the twins' at those seeds), and the paired differences [95% interval]: the probes are the comparison."""
    rows = {}  # (budget, shape, multiplier) -> {seed: record}
    for r in results:
        if r["axis"] == "replace":
            rows.setdefault((r["settings"]["max_flops"], shape_of(r), lr_scale_of(r)), {})[seed_of(r)] = r
    if not rows:
        return ""
    grids = lr_grids(results)
    twins = {(r["model_type"], shape_of(r), seed_of(r)): r["scores"] for r in results if r["axis"] == "random"}
    lines = ["| budget | shape | comparison | multipliers | seeds | val loss (unigram) | linear | kNN | twins: linear / "
             "kNN | difference: linear | kNN |", "|" + "---|" * 11]
    for (budget, shp, m), runs in sorted(rows.items()):
        bert = grids.get((budget, shp, "bert"), {}).get(m, {})
        grid = grids.get((budget, shp, "crossbert"), {})
        own = choose(grid, lambda r: r["val_loss"], min) if grid else None
        pairs = [("BERT 80/10/10 − all-<mask> BERT", f"x{m:g} / x{m:g}", runs, bert)]
        pairs += [(f"CrossBERT − {name}", f"x{own:g} / x{m:g}", grid[own], side) for name, side in
                  (("BERT 80/10/10", runs), ("all-<mask> BERT", bert))] if own else []
        for name, lrs, a, b in pairs:
            common = sorted(set(a) & set(b))
            if not common:
                continue
            cells = []
            for side in (a, b):
                rs = [side[k] for k in common]
                init = [twins[key] for k in common if (key := (rs[0]["model_type"], shp, k)) in twins]
                cells.append((f"{fmt([r['val_loss'] for r in rs], places=3)} ({rs[0]['unigram_loss']:.3f})",
                              *(fmt([r["scores"][key] for r in rs]) for key, _ in PROBES),
                              " / ".join(fmt([t[key] for t in init]) if init else "-" for key, _ in PROBES)))
            diffs = [fmt([a[k]["scores"][key] - b[k]["scores"][key] for k in common], True) for key, _ in PROBES]
            lines.append(f"| {budget:.2e} | {shp} | {name} | {lrs} | {', '.join(map(str, common))} | "
                         + " | ".join(f"{x} vs {y}" for x, y in zip(*cells)) + f" | {' | '.join(diffs)} |")
    return "\n".join(lines) + "\n"


def tokens_table(results):
    """The markdown table of what equal FLOPs buy each family of the main axis, at each budget and shape: input tokens
    (mean over seeds), training FLOPs, input tokens per parameter of BERT at that shape (the ladder's ratio), BERT's
    input tokens over the family's, and the LM head's share of a training step (flops.head_share: CrossBERT with CMS
    predicts every position, BERT its masked share)."""
    cells = {}  # (budget, shape) -> {family: [runs]}
    for r in results:
        if r["axis"] == "main":
            cells.setdefault((r["settings"]["max_flops"], shape_of(r)), {}).setdefault(r["model_type"], []).append(r)
    lines = ["| budget | shape | family | seeds | input tokens | train FLOPs | tokens per BERT parameter | "
             "BERT's tokens / its | LM head's share of a step |", "|" + "---|" * 9]
    for (budget, shp), fams in sorted(cells.items()):
        bert = np.mean([r["tokens"] for r in fams["bert"]]) if "bert" in fams else None
        for fam, rs in sorted(fams.items()):
            tokens = np.mean([r["tokens"] for r in rs])
            share = head_share(make_config({**rs[0]["settings"], "model_type": fam}), fam)
            lines.append(f"| {budget:.2e} | {shp} | {fam} | {len(rs)} | {tokens:,.0f} | "
                         f"{np.mean([r['flops'] for r in rs]):.3e} | {tokens / rung_params(rs[0]):.1f} | "
                         f"{f'{bert / tokens:.2f}' if bert else '-'} | {100 * share:.1f}% |")
    return "\n".join(lines) + "\n"


def tokens_to_reach(points, target):
    """The input tokens from which a run's probe stays at or above `target`, from points [(input tokens > 0, score)] in
    order of tokens: linear in log tokens between the last point below the target and the next. The last crossing, not
    the first, because probes dip early (kNN falls below the untrained features before it climbs): the first would
    count the untrained features as reaching the target. The first point's tokens when no point is below the target (an
    upper bound: nothing earlier was measured); None when the last point is below it."""
    below = [i for i, (_, score) in enumerate(points) if score < target]
    if not below:
        return points[0][0]
    i = below[-1]
    if i == len(points) - 1:
        return None
    (t0, s0), (t1, s1) = points[i], points[i + 1]
    return float(np.exp(np.log(t0) + (target - s0) / (s1 - s0) * (np.log(t1) - np.log(t0))))


def probe_points(r, key):
    """[(input tokens, last-layer score `key`)] of a run along training: its snapshots (trajectory), then its end.
    key "val_loss": minus the val loss at every evaluation after the first step, so that higher is better here too."""
    if key == "val_loss":
        return [(x["tokens"], -x["val_loss"]) for x in r["log"] if x["tokens"]]
    along = [(p["tokens"], p["layers"][str(len(p["layers"]) - 1)][key]) for p in r.get("trajectory", [])]
    return along + [(r["tokens"], r["scores"][key])]


def reach(runs_a, runs_b, key):
    """Input tokens two sets of runs (e.g. CMS on and off, or two families) need to reach a common score on probe
    `key` (or "val_loss", for runs whose losses compare), paired by seed: for each seed both have, the target is the
    lower of the two final scores, which both runs reach (the weaker at its end); each run's tokens to reach it along
    its snapshots and its end (tokens_to_reach);
    and their ratio a / b (below 1: a needs fewer tokens). Returns [(seed, target, tokens a, tokens b, ratio)] and
    the ratios' geometric mean with its 95% interval (stats.fmt_ratio), or "-" without a common seed."""
    a, b = ({seed_of(r): r for r in runs} for runs in (runs_a, runs_b))
    rows = []
    for k in sorted(set(a) & set(b)):
        pa, pb = probe_points(a[k], key), probe_points(b[k], key)
        target = min(pa[-1][1], pb[-1][1])
        ta, tb = tokens_to_reach(pa, target), tokens_to_reach(pb, target)
        rows.append((k, target, ta, tb, ta / tb))
    return rows, fmt_ratio([row[4] for row in rows]) if rows else "-"


def cms_table(results):
    """CrossBERT with complementary masking (the main runs) against one view without it (the cms axis), per shape
    and probe, and the val loss (both score the masked half of 50% views): the input tokens each needs to reach a
    common score (reach(): the lower final score of each seed pair, along the snapshots or evaluations), their ratio
    on / off per seed and over seeds, and what the same points cost in training FLOPs (the ratio times on's FLOPs per
    input token over off's: CMS runs twice the views)."""
    rows = []
    for shape in sorted({shape_of(r) for r in results if r["axis"] == "cms"}, key=lambda x: [int(n) for n in x.split("x")]):
        off = [r for r in results if r["axis"] == "cms" and shape_of(r) == shape]
        on = [r for r in results if r["axis"] == "main" and r["model_type"] == "crossbert" and shape_of(r) == shape]
        per_token = {name: np.mean([r["flops"] / r["tokens"] for r in rs]) for name, rs in (("on", on), ("off", off))}
        for key, probe in (*PROBES, ("val_loss", "val loss")):
            pairs, ratio = reach(on, off, key)
            if pairs:
                seeds = ", ".join(f"{k}: {a / 1e6:.1f}M / {b / 1e6:.1f}M = {x:.2f}" for k, _, a, b, x in pairs)
                flops = np.exp(np.mean(np.log([x for *_, x in pairs]))) * per_token["on"] / per_token["off"]
                rows.append(f"| {shape} | {probe} | {seeds} | {ratio} | {flops:.2f}x |")
    return "\n".join(["| shape | probe | seed: tokens on / off = ratio (to each pair's lower final score) | on / off over "
                      "seeds [95%] | FLOPs on / off to the same point |", "|" + "---|" * 5, *rows, ""]) if rows else ""


def variant_of(r):
    """What a run of the mask and predictor axes (or its main run) sets: its mask ratio, views and predictor depth."""
    cfg = make_config({**r["settings"], "model_type": r["model_type"]})
    return (f"mask {cfg.mask_ratio:.3g}, {cfg.views[0]} view{'s' * (cfg.views[0] > 1)}" +
            (f", {cfg.pred_layer}-block predictor" if r["model_type"] == "crossbert" else ""))


def ablation_table(results):
    """The mask and predictor axes as markdown ("" without them): per shape, budget and family, its main run and each
    variant (variant_of), mean ± sd over seeds of the val loss and the two probes, and paired by seed [95% interval]:
    the variant minus the main run at equal FLOPs, and every run minus the random twin holding its seed's initial
    weights (the twins are the main runs' encoders at init; the variants build the same encoder)."""
    main = {(r["settings"]["max_flops"], shape_of(r), r["model_type"], seed_of(r)): r for r in results
            if r["axis"] == "main"}
    twins = {(r["model_type"], shape_of(r), seed_of(r)): r["scores"] for r in results if r["axis"] == "random"}
    cells = {}  # (budget, shape, family) -> {variant: [runs]}
    for r in results:
        if r["axis"] in ("mask", "predictor"):
            cells.setdefault((r["settings"]["max_flops"], shape_of(r), r["model_type"]), {}).setdefault(
                variant_of(r), []).append(r)
    if not cells:
        return ""
    lines = ["| budget | shape | family | run | seeds | val loss | linear | kNN | − main run: linear | kNN | − twins: "
             "linear | kNN |", "|" + "---|" * 12]
    diff = lambda xs: fmt(xs, True) if xs else "-"
    for (budget, shp, fam), variants in sorted(cells.items()):
        ref = [main[key] for key in sorted(main) if key[:3] == (budget, shp, fam)]
        for name, rs in ([(f"main: {variant_of(ref[0])}", ref)] if ref else []) + sorted(variants.items()):
            to_main = [diff([r["scores"][k] - main[budget, shp, fam, seed_of(r)]["scores"][k] for r in rs
                             if rs is not ref and (budget, shp, fam, seed_of(r)) in main]) for k, _ in PROBES]
            to_twin = [diff([r["scores"][k] - twins[fam, shp, seed_of(r)][k] for r in rs
                             if (fam, shp, seed_of(r)) in twins]) for k, _ in PROBES]
            lines.append(" | ".join([f"| {budget:.2e}", shp, fam, name, ", ".join(str(seed_of(r)) for r in rs),
                                     fmt([r["val_loss"] for r in rs], places=3),
                                     *(fmt([r["scores"][k] for r in rs]) for k, _ in PROBES), *to_main, *to_twin]) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(results, out_dir):
    """out_dir/results.md: the summary, the probes across layers and along training (runs that have them), each family
    at its own learning rate (with runs of the lr axis), the tokens equal FLOPs buy, then every run (written whole,
    then renamed)."""
    tmp = os.path.join(out_dir, "results.md.tmp")
    extra = ""
    if cells_of(results, "layers"):
        extra += ("\n## Across layers\n\nThe primary averages layer by layer (0 = the token embeddings, no context), mean "
                  "over seeds; the best layer of that mean; and paired by seed, [95% interval]: last − best (below 0 when "
                  "the last layers serve reconstruction, the paper's diagnosis of BERT), last − layer 0 (what context "
                  "adds), the same for the random twins, and trained − twin at the last layer.\n\n" + layer_table(results))
    if cells_of(results, "trajectory"):
        extra += ("\n## Along training\n\nThe probes at log-spaced points of each run (mean ± sd over seeds), at the last "
                  "layer and at the best layer of each point, beside the val loss there; FLOPs 0 is the random twins, "
                  "every run's initial weights.\n\n" + trajectory_table(results))
    lr = own_lr(results)
    if lr:
        extra += ("\n## Each family at its own learning rate\n\nEach family at multiples of the power law's learning "
                  "rate (x1: the main axis), mean ± sd over seeds. The rule, fixed before the runs: each family takes "
                  "the multiplier with its own lowest mean val loss, over the seeds every multiplier has (seed 0 alone "
                  "when the grid has one seed); the linear probe's pick by the same rule is beside it, a sensitivity, "
                  f"not the choice. The baseline is {BASELINE} (BERT's own corruption, the stronger BERT: the next "
                  "section); it ran at all-<mask> BERT's chosen multiplier alone, so its one multiplier is its choice. "
                  "The all-<mask> BERT (bert) stays beside it, the ladder's BERT before.\n\n" + lr)
    corruption = replace_table(results)
    if corruption:
        extra += ("\n## BERT's corruption: 80/10/10 against all <mask>\n\nBERT with BERT's own rule (80% <mask>, 10% a "
                  "random token, 10% unchanged) against the all-<mask> BERT of the main and lr axes at the same "
                  "learning rate, and CrossBERT at its own chosen rate against each, paired by seed at equal FLOPs; the "
                  "stronger BERT on the frozen probes is the baseline (80/10/10's val loss counts targets its input "
                  "shows unchanged, so the losses do not compare).\n\n" + corruption)
    cms = cms_table(results)
    if cms:
        extra += ("\n## Complementary masking: input tokens to the same score\n\nCrossBERT with CMS (two complementary "
                  "views a row, every token a target once) against one 50% view, at equal steps and input tokens, on "
                  "the probes (last layer) and the val loss: below 1x, CMS needs fewer input tokens (the paper's claim "
                  "is 2x, i.e. 0.5x here), at the FLOPs in the last column.\n\n" + cms)
    ablations = ablation_table(results)
    if ablations:
        extra += ("\n## The mask ratio and the predictor's depth\n\nEach variant at its main run's FLOPs (val losses "
                  "compare within a mask ratio only: each ratio predicts a different share from a different context), "
                  "against the main run and against the random twins, paired by seed.\n\n" + ablations)
    if any(r["axis"] == "main" for r in results):
        extra += ("\n## Tokens seen at equal FLOPs\n\nWhat each family's FLOPs buy: input tokens (rows x block), per "
                  "parameter of BERT at that shape, BERT's over the family's, and the share of a training step the LM "
                  "head takes (flops.py's head_share).\n\n" + tokens_table(results))
    with open(tmp, "w") as f:
        f.write(summarize(results) + extra + "\n## Every run\n\n" + table(results))
    os.replace(tmp, os.path.join(out_dir, "results.md"))


def table(results):
    """Every run, one row each; a dtype of "-": a random twin (untrained), or a record written before records kept it."""
    tasks = sorted({k.rsplit("/", 1)[0] for r in results for k in r["scores"] if "/" in k})
    glue = any("glue_linear_avg" in r["scores"] for r in results)
    head = ["run", "axis", "dtype", "params (M)", "train FLOPs", "steps", "input tokens", "val loss", "unigram",
            "linear avg", "kNN avg"] + ["GLUE linear", "GLUE kNN"] * glue + ["STS 0-shot"] + [f"{t} lin/kNN" for t in tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        sc = r["scores"]
        cells = [r["name"], r["axis"], r.get("dtype", "-"), f"{r['params'] / 1e6:.2f}",
                 f"{r['flops']:.2e}" if r["flops"] else "0", str(r["steps"]), f"{r['tokens']:,}",
                 f"{r['val_loss']:.3f}" if r["val_loss"] else "-",
                 f"{r['unigram_loss']:.3f}" if r["unigram_loss"] else "-", f"{sc['linear_avg']:.1f}",
                 f"{sc['knn_avg']:.1f}"]
        cells += [f"{sc[k]:.1f}" if k in sc else "-" for k in ("glue_linear_avg", "glue_knn_avg")] * glue
        cells += [f"{sc['sts_zero_shot']:.1f}" if "sts_zero_shot" in sc else "-"]
        cells += [f"{sc[t + '/linear']:.1f} / {sc[t + '/knn']:.1f}" if t + "/linear" in sc else "-" for t in tasks]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plots(results, out_dir):
    """Draws the sweep's figures into out_dir; returns their file names. Without matplotlib (an optional extra), a
    UserError that names the pip command."""
    matplotlib = optional("matplotlib", "drawing the sweep's plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(zip((*MODELS, BASELINE), ("tab:red", "tab:blue", "tab:green", "tab:purple")))  # lr grids: by family
    main = [r for r in results if r["axis"] == "main"]
    written = []

    if main:  # an lr-only sweep has no main runs: it draws lr-<shape>.png
        written.append(plot_flops(plt, results, main, colors, out_dir))
    if len({shape_of(r) for r in main}) > 1:  # sizes: the paper's axis (the ladder preset)
        written.append(plot_sizes(plt, results, main, colors, out_dir))
    written += plot_along(plt, results, colors, out_dir)

    fig, ax = plt.subplots(figsize=(6, 4.2))
    trained = main or [r for r in results if r["axis"] != "random"]  # a sweep of one other axis (lr, mask): its runs
    budgets = sorted({r["settings"]["max_flops"] for r in trained})
    for r in trained:  # colour: the family; line style: the size
        curve = [(x["flops"], x["val_loss"]) for x in r["log"] if "val_loss" in x and x["flops"]]
        style = ("-", "--", "-.", ":")[(len(budgets) - 1 - budgets.index(r["settings"]["max_flops"])) % 4]
        ax.plot(*zip(*curve), style, color=colors[r["model_type"]], alpha=0.8, label=r["name"])
        ax.axhline(r["unigram_loss"], color="gray", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="training FLOPs", ylabel="val masked-token loss (nats)",
           title="val loss (ELECTRA: its generator's; dotted: unigram)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "val_loss_vs_flops.png"), dpi=120)
    written.append("val_loss_vs_flops.png")

    written += plot_cms(plt, results, out_dir)
    written += plot_lr(plt, results, colors, out_dir)
    plt.close("all")
    return written


def rung_params(r):
    """A run's size on the paper's axis: the parameters of BERT at its shape (embeddings included), the size every
    family at that rung is FLOP-matched to."""
    return param_counts(make_config({**r["settings"], "model_type": "bert"}), "bert")[0]


def plot_flops(plt, results, main, colors, out_dir):
    """probe_vs_flops.png, the paper's Fig. 1 at the sweep's scale: each family's linear, kNN and zero-shot STS scores
    of the main runs against training FLOPs (mean ± sd over seeds), its random twins beside them."""
    from matplotlib.ticker import NullFormatter
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axs, ("linear_avg", "knn_avg", "sts_zero_shot"),
                              ("linear probe, primary average", "kNN probe, primary average",
                               "zero-shot STS (Spearman)")):
        for fam in colors:
            cells = {}  # budget -> this family's scores over training seeds, and its shape's random twins
            for r in main:
                if r["model_type"] == fam and key in r["scores"]:
                    cells.setdefault(r["flops"] and r["settings"]["max_flops"], (shape_of(r), []))[1].append(r["scores"][key])
            if not cells:
                continue
            xs = sorted(cells)
            ax.errorbar(xs, [np.mean(cells[x][1]) for x in xs], fmt="o-", color=colors[fam], capsize=3, label=fam,
                        yerr=[sd_or_0(cells[x][1]) for x in xs])
            twins = [[t["scores"][key] for t in results if t["axis"] == "random" and t["model_type"] == fam
                      and shape_of(t) == cells[x][0] and key in t["scores"]] for x in xs]
            if all(twins):
                ax.errorbar(xs, [np.mean(t) for t in twins], yerr=[sd_or_0(t) for t in twins],
                            fmt="x--", color=colors[fam], alpha=0.6, capsize=3, label=f"{fam} random init")
        ax.set(xscale="log", xlabel="training FLOPs", title=title + " (mean ± sd over seeds)")
        ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: no overlapping labels
        if ax.has_data():  # a score no run has (zero-shot STS with --sts=) leaves its panel empty
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "probe_vs_flops.png"), dpi=120)
    return "probe_vs_flops.png"


def sd_or_0(xs):
    """An error bar over seeds: their sd (stats.interval's), or none (0) for one seed."""
    return interval(xs)[1] or 0


def save(fig, axs, out_dir, name):
    """Labels every panel of fig (axs), lays it out and writes it to out_dir/name; returns name."""
    for ax in axs:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=120)
    return name


def plot_sizes(plt, results, main, colors, out_dir):
    """probe_vs_params.png: the linear and kNN averages against model size (mean ± sd over seeds), each family's
    random twins as a band (mean ± sd), and each run's val loss below its unigram baseline."""
    fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axs, ("linear_avg", "knn_avg"), ("linear probe", "kNN probe")):
        for fam, color in colors.items():
            rungs = {}  # parameters -> (shape, this family's scores over seeds)
            for r in main:
                if r["model_type"] == fam:
                    rungs.setdefault(rung_params(r), (shape_of(r), []))[1].append(r["scores"][key])
            if not rungs:
                continue
            xs = sorted(rungs)
            ax.errorbar(xs, [np.mean(rungs[x][1]) for x in xs], capsize=3, fmt="o-", color=color, label=fam,
                        yerr=[sd_or_0(rungs[x][1]) for x in xs])
            twins = [[t["scores"][key] for t in results if t["axis"] == "random" and t["model_type"] == fam
                      and shape_of(t) == rungs[x][0]] for x in xs]
            if all(twins):
                mean, sd = np.array([np.mean(t) for t in twins]), np.array([np.std(t) for t in twins])
                ax.fill_between(xs, mean - sd, mean + sd, color=color, alpha=0.15, label=f"{fam} random init (± sd)")
        ax.set(xscale="log", xlabel="parameters (BERT's at each size; every family at its FLOPs)",
               title=f"{title}, primary average (mean ± sd over seeds)")
    ax = axs[2]
    for fam, color in colors.items():
        pts = [(rung_params(r), r["unigram_loss"] - r["val_loss"]) for r in main if r["model_type"] == fam]
        if pts:
            ax.plot(*zip(*sorted(pts)), "o", color=color, label=fam)
    ax.axhline(0, color="gray", ls=":", lw=0.8)
    ax.set(xscale="log", xlabel="parameters (BERT's at each size)", ylabel="unigram − val loss (nats)",
           title="val loss below its unigram baseline (ELECTRA: its generator's)")
    return save(fig, axs, out_dir, "probe_vs_params.png")


def cms_curves(r):
    """A run's points along training (its snapshots, then its end) for the CMS plots: {x axis: [...], probe or val
    loss: [...]}, the probes at the last layer."""
    points = [dict(tokens=p["tokens"], flops=p["flops"], val_loss=p["val_loss"], **p["layers"][str(len(p["layers"]) - 1)])
              for p in r.get("trajectory", [])] + [dict(tokens=r["tokens"], flops=r["flops"], val_loss=r["val_loss"],
                                                         **r["scores"])]
    return {key: [p[key] for p in points] for key in ("tokens", "flops", "val_loss", *(k for k, _ in PROBES))}


def plot_cms(plt, results, out_dir):
    """Per shape with runs of the cms axis: cms-<shape>.png, CrossBERT with CMS (the main runs) and with one view, each
    seed a line: the linear and kNN probes (last layer) and the val loss along training, against input tokens (the
    paper's sample-efficiency axis) and against training FLOPs (what CMS's second view costs)."""
    written = []
    for shape in sorted({shape_of(r) for r in results if r["axis"] == "cms"}):
        runs = [(r, "tab:blue", "CMS (2 views)") for r in results if r["axis"] == "main"
                and r["model_type"] == "crossbert" and shape_of(r) == shape]
        runs += [(r, "tab:orange", "one 50% view") for r in results if r["axis"] == "cms" and shape_of(r) == shape]
        fig, axs = plt.subplots(2, 3, figsize=(15, 8))
        for row, x in zip(axs, ("tokens", "flops")):
            for ax, (key, title) in zip(row, (*PROBES, ("val_loss", "val loss (nats)"))):
                for r, color, label in runs:
                    curve = cms_curves(r)
                    ax.plot(curve[x], curve[key], "o-", color=color, alpha=0.7, ms=3,
                            label=f"{label}, seed {seed_of(r)}")
                ax.set(xscale="log", xlabel="input tokens" if x == "tokens" else "training FLOPs",
                       title=f"{title}, {shape}" if key == "val_loss" else f"{title} probe (last layer), {shape}")
        axs[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"cms-{shape}.png"), dpi=120)
        written.append(f"cms-{shape}.png")
    return written


def plot_lr(plt, results, colors, out_dir):
    """Per shape with runs of the lr axis: lr-<shape>.png, each family's val loss and last-layer linear and kNN probes
    against its multiple of the power law's learning rate. Each seed is a dot; the line joins the means over the seeds
    every multiplier has (what the rule chooses by, own_lr), with the chosen multiplier ringed; the family's random
    twins are a band (mean ± sd)."""
    from matplotlib.ticker import NullFormatter  # the multipliers only: no overlapping labels
    grids = lr_grids(results)
    twins = {}
    for r in results:
        if r["axis"] == "random":
            twins.setdefault((r["model_type"], shape_of(r)), []).append(r)
    written = []
    for shape in sorted({shp for _, shp, _ in grids}):
        fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
        ms = sorted({m for (_, shp, _), grid in grids.items() if shp == shape for m in grid})
        for (budget, shp, fam), grid in sorted(grids.items()):
            if shp != shape:
                continue
            pick, label = choose(grid, lambda r: r["val_loss"], min), f"{fam}, {budget:.2g} FLOPs"
            for ax, (key, title) in zip(axs, (("val_loss", "val loss (ringed: the rule's choice)"),
                                              *((k, f"{probe} probe (last layer)") for k, probe in PROBES))):
                value = (lambda r: r["val_loss"]) if key == "val_loss" else (lambda r, k=key: r["scores"][k])
                dots = [(m, value(r)) for m, runs in sorted(grid.items()) for r in runs.values()]
                ax.plot(*zip(*dots), ".", color=colors[fam], alpha=0.5)
                means = grid_means(grid, value)
                if means:
                    ax.plot(sorted(means), [means[m] for m in sorted(means)], "o-", color=colors[fam], label=label)
                    ax.plot([pick], [means[pick]], "o", ms=13, mfc="none", color=colors[fam])
                init = [t["scores"][key] for t in twins.get((fam, shape), []) if key != "val_loss"]
                if init:
                    ax.axhspan(np.mean(init) - np.std(init), np.mean(init) + np.std(init), color=colors[fam],
                               alpha=0.12, label=f"{fam} random init (± sd)")
                ax.set(xscale="log", xticks=ms, xticklabels=[f"x{m:g}" for m in ms],
                       xlabel="multiple of the power law's learning rate", title=f"{title}, {shape}")
                ax.xaxis.set_minor_formatter(NullFormatter())
        written.append(save(fig, axs, out_dir, f"lr-{shape}.png"))
    return written


def plot_along(plt, results, colors, out_dir):
    """Per shape: trajectory-<shape>.png, each family's last-layer probes against training FLOPs (mean ± sd over
    seeds; the twins, FLOPs 0, as a band) beside its val loss; layers-<shape>.png, the probes layer by layer, trained
    and twins. Only runs that were probed along training and across layers have them."""
    from matplotlib.ticker import NullFormatter  # decades only: no overlapping labels
    written = []
    twins = {}
    for r in results:
        if r["axis"] == "random" and "layers" in r:
            twins.setdefault((r["model_type"], shape_of(r)), []).append(r)
    shapes = {}
    for cell, rs in cells_of(results, "trajectory").items():
        shapes.setdefault(shape_of(rs[0]), []).append(rs)
    for shape, cells in shapes.items():
        fig, axs = plt.subplots(1, 3, figsize=(15, 4.2))
        for rs in cells:
            fam, color = rs[0]["model_type"], colors[rs[0]["model_type"]]
            tw = twins.get((fam, shape), [])
            points = [p for p in trajectory_points(rs, tw) if p[1] > 0]
            xs = [p[1] for p in points]
            for ax, (key, probe) in zip(axs, PROBES):
                ax.errorbar(xs, [np.mean(p[4][key]) for p in points], capsize=3, fmt="o-", color=color, label=fam,
                            yerr=[sd_or_0(p[4][key]) for p in points])
                if tw:
                    init = [t["layers"][str(len(t["layers"]) - 1)][key] for t in tw]
                    ax.axhspan(np.mean(init) - np.std(init), np.mean(init) + np.std(init), color=color, alpha=0.12,
                               label=f"{fam} random init (± sd)")
                ax.set(xscale="log", xlabel="training FLOPs", title=f"{probe} probe, last layer, {shape}")
                ax.xaxis.set_minor_formatter(NullFormatter())
            axs[2].plot(xs, [np.mean(p[3]) for p in points], "o-", color=color, label=fam)
            axs[2].axhline(rs[0]["unigram_loss"], color="gray", ls=":", lw=0.8)
        axs[2].set(xscale="log", xlabel="training FLOPs", ylabel="val masked-token loss (nats)",
                   title=f"val loss at the same points, {shape} (dotted: unigram)")
        axs[2].xaxis.set_minor_formatter(NullFormatter())
        written.append(save(fig, axs, out_dir, f"trajectory-{shape}.png"))
    shapes = {}
    for cell, rs in cells_of(results, "layers").items():
        shapes.setdefault(shape_of(rs[0]), []).append(rs)
    for shape, cells in shapes.items():
        fig, axs = plt.subplots(1, 2, figsize=(10, 4.2))
        for rs in cells:
            fam, color = rs[0]["model_type"], colors[rs[0]["model_type"]]
            n = len(rs[0]["layers"])
            for ax, (key, probe) in zip(axs, PROBES):
                for runs, style, label in ((rs, "o-", fam), (twins.get((fam, shape), []), "x--", f"{fam} random init")):
                    if runs:
                        by = np.array([[r["layers"][str(i)][key] for i in range(n)] for r in runs])
                        ax.errorbar(range(n), by.mean(0), yerr=by.std(0, ddof=1) if len(by) > 1 else None, fmt=style,
                                    color=color, capsize=3, alpha=1 if style == "o-" else 0.6, label=label)
                ax.set(xlabel="layer (0: token embeddings)", xticks=range(n),
                       title=f"{probe} probe by layer, {shape} (mean ± sd over seeds)")
        written.append(save(fig, axs, out_dir, f"layers-{shape}.png"))
    return written


# -----------------------------------------------------------------------------
# The GPU runs' report


class Report:
    """The markdown report and its JSON twin, rewritten after every part."""

    def __init__(self, path, header):
        self.path, self.header, self.parts, self.data, self.times = path, header, [], {}, {}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def add(self, name, seconds, markdown, data=None):
        self.times[name] = round(seconds, 1)
        if markdown:
            self.parts.append(markdown)
        self.data[name] = data
        times = "\n".join(f"| {k} | {v:.0f} |" for k, v in self.times.items())
        text = "\n\n".join([self.header, *self.parts,
                            f"## Time\n\n| part | seconds |\n|---|---|\n{times}\n| total | {sum(self.times.values()):.0f} |"])
        for path, content in ((self.path, text + "\n"),
                              (self.path.removesuffix(".md") + ".json", json.dumps(dict(self.data, times=self.times), indent=1))):
            with open(path + ".tmp", "w") as f:
                f.write(content)
            os.replace(path + ".tmp", path)
