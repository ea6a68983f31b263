"""report.py on hand-made records: each family at its own learning rate (the fixed rule, the differences at equal FLOPs
and their trend over sizes), the tokens equal FLOPs buy, and the input tokens two sets of runs need to reach a common
score."""
import math

import pytest

import report
from flops import param_counts
from configurator import make_config

BUDGETS = {(2, 128): 1.2e14, (3, 192): 6.4e14, (4, 256): 2.4e15}


def run(fam, shape, seed, m, val, lin, knn, tokens=1_000_000):
    """A sweep record: the main axis at x1 (no lr_scale, as records before the lr axis), the lr axis otherwise."""
    (L, C), budget = shape, BUDGETS[shape]
    r = dict(name=f"{fam}-{L}x{C}" + (f"-lr{m:g}" if m != 1 else "") + (f"-s{seed}" if seed else ""),
             axis="main" if m == 1 else "lr", seed=seed, shape=f"{L}x{C}", model_type=fam, params=1e6, steps=100,
             settings=dict(model_type=fam, n_layer=L, n_embd=C, n_head=C // 64, block_size=128, vocab_size=8192,
                           max_flops=budget),
             flops=budget, tokens=tokens, val_loss=val, unigram_loss=6.4, scores=dict(linear_avg=lin, knn_avg=knn))
    return r if m == 1 else dict(r, lr_scale=m)


def grid():
    """Two shapes; x1 at seeds 0-2, the lr axis at seeds 0-1 (x2 of BERT 2 x 128 at seed 0 alone)."""
    small, large = (2, 128), (4, 256)
    rs = [run("bert", small, k, 1, v, 60 + k, 50) for k, v in enumerate((3.8, 4.3, 4.3))]
    rs += [run("bert", small, k, 0.5, 3.9, 63 + k, 51) for k in range(2)]
    rs += [run("bert", small, 0, 2, 4.5, 58, 49)]
    rs += [run("crossbert", small, k, 1, 5.0, 62 + k, 51) for k in range(3)]  # x1: +2 linear, +1 kNN at every seed
    rs += [run("crossbert", small, k, 2, 4.8, 65 + k, 52) for k in range(2)]
    rs += [run("bert", large, k, 1, 3.4, 64, 60) for k in range(3)]
    rs += [run("bert", large, k, 0.5, 3.3, 66, 61) for k in range(2)]
    rs += [run("crossbert", large, k, 1, 4.3, 65, 60) for k in range(3)]  # x1: +1 linear, 0 kNN
    rs += [run("crossbert", large, k, 2, 4.4, 67, 62) for k in range(2)]
    return rs


def bert_params(L, C):
    return param_counts(make_config(dict(model_type="bert", n_layer=L, n_embd=C, n_head=C // 64, vocab_size=8192)),
                        "bert")[0]


def rows_of(md, start):
    return [line.split(" | ") for line in md.splitlines() if line.startswith(start)]


def test_each_family_takes_the_multiplier_of_its_own_lowest_val_loss():
    md = report.own_lr(grid())
    rows = {(r[1], r[2], r[3]): r for r in rows_of(md, "| 1.20e+14") + rows_of(md, "| 2.40e+15") if len(r) == 10}
    # BERT 2 x 128 at seed 0, the one seed every multiplier has: x1 3.8, x0.5 3.9, x2 4.5, so x1, though x1's mean over
    # its three seeds (4.13) is above x0.5's (3.9); the linear probe at seed 0 would pick x0.5 (63 against 60 and 58)
    bert = {m: rows["2x128", "bert", m] for m in ("x0.5", "x1", "x2")}
    assert [bert[m][-2] for m in ("x0.5", "x1", "x2")] == ["-", "yes", "-"]
    assert [bert[m][-1] for m in ("x0.5", "x1", "x2")] == ["yes |", "- |", "- |"]
    assert bert["x1"][4:6] == ["0, 1, 2", "4.133 ± 0.289"] and bert["x2"][4] == "0"
    # CrossBERT 2 x 128 over seeds 0 and 1: x2 (4.8) below x1 (5.0); at 4 x 256 x1 (4.3) below x2 (4.4)
    assert rows["2x128", "crossbert", "x2"][-2] == "yes" and rows["4x256", "crossbert", "x1"][-2] == "yes"
    assert rows["4x256", "bert", "x0.5"][-2] == "yes"


def test_differences_at_the_law_and_at_each_familys_choice_with_their_trend_over_sizes():
    md = report.own_lr(grid())
    rows = rows_of(md, "| 1.20e+14") + rows_of(md, "| 2.40e+15")
    diff = {(r[1], r[3]): r[4:] for r in rows if "crossbert − bert" in r}
    # the law: every seed pair, +2 linear and +1 kNN at 2 x 128, +1 and 0 at 4 x 256
    law = ["x1 / x1", "3", "+2.0 [+2.0, +2.0]", "+1.0 [+1.0, +1.0]", "above / above |"]
    assert diff["2x128", "the law (x1)"] == law
    assert diff["4x256", "the law (x1)"][:4] == ["x1 / x1", "3", "+1.0 [+1.0, +1.0]", "+0.0 [+0.0, +0.0]"]
    # each its own: CrossBERT x2 against BERT x1 at 2 x 128 (seeds 0, 1: 65 - 60, 66 - 61), CrossBERT x1 against
    # BERT x0.5 at 4 x 256 (65 - 66; kNN 60 - 61)
    assert diff["2x128", "each its own"][:4] == ["x2 / x1", "2", "+5.0 [+5.0, +5.0]", "+2.0 [+2.0, +2.0]"]
    assert diff["4x256", "each its own"][:4] == ["x1 / x0.5", "2", "-1.0 [-1.0, -1.0]", "-1.0 [-1.0, -1.0]"]
    # per doubling of BERT's parameters: linear +2 -> +1 at the law, +5 -> -1 at the choices
    doublings = math.log2(bert_params(4, 256) / bert_params(2, 128))
    law, own = -1 / doublings, -6 / doublings
    assert f"| crossbert − bert | the law (x1) | linear | 6 | {law:+.2f} [{law:+.2f}, {law:+.2f}] |" in md
    assert f"| crossbert − bert | each its own | linear | 4 | {own:+.2f} [{own:+.2f}, {own:+.2f}] |" in md


def test_each_familys_law_is_fitted_to_its_choices_and_gives_the_untried_rungs_command():
    # the choices above: BERT x1 at 1.2e14, x0.5 at 2.4e15; CrossBERT x2, then x1: both fall by 2x over 20x FLOPs
    laws = report.lr_laws({(1.2e14, "2x128", "bert"): 1.0, (2.4e15, "4x256", "bert"): 0.5,
                           (1.2e14, "2x128", "crossbert"): 2.0, (2.4e15, "4x256", "crossbert"): None,
                           (1.2e14, "2x128", "electra"): 0.5})
    d = math.log(0.5) / math.log(20)
    assert laws["bert"][1:] == (1.2e14, pytest.approx(1.0), pytest.approx(d))
    assert laws["crossbert"][1:] == (1.2e14, 2.0, 0.0) and laws["electra"][1:] == (1.2e14, 0.5, 0.0)  # one budget each
    # a rung with main runs and no grid (3 x 192 at 6.4e14) gets the multiplier the law gives there, and its command
    md = report.own_lr(grid() + [run(f, (3, 192), 0, 1, 4.0, 60, 50) for f in ("bert", "crossbert")])
    cross = 2 * (6.4e14 / 1.2e14) ** d
    row = next(line for line in md.splitlines() if line.startswith("| crossbert | 1.20e+14: x2, 2.40e+15: x1 |"))
    assert f"3x192 x{cross:.2g} (`--axes=lr --budgets=6.4e14 --families=crossbert --lr_scales={cross:.2g}`)" in row
    # rungs with a grid: their choice, no command; no vertex (lowest at an edge): no law of the smoothed optima
    assert "2x128 x2; " in row and row.endswith("; 4x256 x1 | - |")
    # x2 at two budgets: a slope of 0 shown as +0.000, though the fit's is a rounding error away from 0
    same = [run("bert", shape, 0, m, 4.0 - (m == 2) / 10, 60, 50) for shape in ((2, 128), (3, 192)) for m in (1, 2)]
    bert = next(line for line in report.own_lr(same).splitlines() if line.startswith("| bert | "))
    assert "| 2 at 1.20e+14 | +0.000 |" in bert


def test_the_smoothed_optimum_is_the_vertex_through_the_lowest_point_and_its_neighbours():
    # a loss quadratic in log2 of the multiplier with its minimum at x1.5: the vertex recovers it from x1, x2, x4
    # (x0.5, far from it, is left out), whichever of them is lowest
    loss = lambda m: 4.0 + 0.1 * (math.log2(m) - math.log2(1.5)) ** 2
    g = {m: {0: dict(val_loss=loss(m)), 1: dict(val_loss=loss(m) + 0.3)} for m in (1, 2, 4)}
    assert report.smoothed_optimum({**g, 0.5: {0: dict(val_loss=3.0)}}) is None  # lowest at the edge
    assert report.smoothed_optimum({**g, 0.5: {0: dict(val_loss=9.0)}}) == pytest.approx(1.5)
    assert report.smoothed_optimum({m: {1: r[1]} for m, r in g.items()}) == pytest.approx(1.5)  # seed 1: +0.3 each
    assert report.smoothed_optimum({m: g[m] for m in (1, 2)}) is None  # x2 lowest, at the edge
    # the table: BERT 2 x 128 at seed 0, x0.5 3.9, x1 3.8, x2 4.5: the vertex at log2 m = -0.375; its other grid and
    # CrossBERT's are lowest at an edge
    row = next(line for line in report.own_lr(grid()).splitlines() if line.startswith("| bert | "))
    assert row.split(" | ")[2] == f"1.20e+14: x{2 ** -0.375:.2g}, 2.40e+15: -"


def test_the_smoothed_optima_get_a_law_of_their_own_that_names_the_untried_rungs_command():
    # BERT's loss quadratic in log2 of the multiplier, its minimum at x1.5 at 2 x 128 and x3 at 3 x 192; 4 x 256 has
    # main runs only. CrossBERT's grid is lowest at its edge at both: no vertex, no law
    def loss(m, best):
        return 4.0 + 0.1 * (math.log2(m) - math.log2(best)) ** 2
    rs = [run("bert", shape, 0, m, loss(m, best), 60, 50) for shape, best in (((2, 128), 1.5), ((3, 192), 3.0))
          for m in (1, 2, 4, 8)]
    rs += [run("crossbert", shape, 0, m, 5.0 - m / 10, 60, 50) for shape in ((2, 128), (3, 192)) for m in (1, 2)]
    rs += [run(f, (4, 256), 0, 1, 3.4, 64, 60) for f in ("bert", "crossbert")]
    md = report.own_lr(rs)
    d = math.log(2) / math.log(6.4e14 / 1.2e14)
    m = 1.5 * (2.4e15 / 1.2e14) ** d
    bert = next(line for line in md.splitlines() if line.startswith("| bert | "))
    assert bert.split(" | ")[2] == "1.20e+14: x1.5, 6.40e+14: x3"
    assert bert.endswith(f"| {d:+.3f}: 2x128 x1.5; 3x192 x3; 4x256 x{m:.2g} (`--axes=lr --budgets=2.4e15 "
                         f"--families=bert --lr_scales={m:.2g}`) |")
    assert next(line for line in md.splitlines() if line.startswith("| crossbert | ")).endswith(" | - |")


def test_the_lr_section_needs_runs_of_the_lr_axis(tmp_path):
    main = [r for r in grid() if r["axis"] == "main"]
    assert report.own_lr(main) == ""
    report.write_markdown(main, tmp_path)
    assert "own learning rate" not in (tmp_path / "results.md").read_text()
    report.write_markdown(grid(), tmp_path)
    assert "## Each family at its own learning rate" in (tmp_path / "results.md").read_text()


def test_tokens_at_equal_flops_and_the_heads_share():
    shape, P = (2, 128), bert_params(2, 128)
    rs = [run("bert", shape, k, 1, 4.3, 60, 50, tokens=20 * P) for k in range(2)]
    rs += [run("crossbert", shape, 0, 1, 4.9, 61, 50, tokens=8 * P)]
    rows = {r[2]: r for r in rows_of(report.tokens_table(rs), "| 1.20e+14")}
    # 20 and 8 tokens per BERT parameter: BERT sees 2.5 times CrossBERT's tokens. The head's share, by hand: BERT
    # 2 x 128 predicts 26 of 128 positions, 55.4 of 174.9 MFLOPs a row (31.7%); CrossBERT predicts 64 per view,
    # 136.3 of 219.7 MFLOPs a view (62.1%)
    assert rows["bert"][3:] == ["2", f"{20 * P:,}", "1.200e+14", "20.0", "1.00", "31.7% |"]
    assert rows["crossbert"][3:] == ["1", f"{8 * P:,}", "1.200e+14", "8.0", "2.50", "62.1% |"]


def test_tokens_to_reach_is_the_last_crossing_in_log_tokens():
    points = [(1e6, 50.0), (2e6, 58.0), (4e6, 54.0), (8e6, 60.0)]
    # 56 is crossed three times; from 4e6 on the run stays above it: a third of the way from 54 to 60, in log tokens
    assert report.tokens_to_reach(points, 56.0) == pytest.approx(4e6 * 2 ** (1 / 3))
    assert report.tokens_to_reach(points, 49.0) == 1e6    # already there at the first point: an upper bound
    assert report.tokens_to_reach(points, 61.0) is None  # never reached
    assert report.tokens_to_reach(points, 60.0) == pytest.approx(8e6)


def along(fam, seed, scores, end):
    """A run with snapshots at 1M and 4M input tokens and its end at 16M; scores by layer, the last one read."""
    snap = [dict(step=s, tokens=t, flops=0.0, val_loss=5.0, layers={"0": dict(linear_avg=0.0), "1": dict(linear_avg=x)})
            for s, (t, x) in enumerate(zip((1e6, 4e6), scores), start=1)]
    return dict(name=f"{fam}-s{seed}", seed=seed, model_type=fam, tokens=16e6, trajectory=snap,
                scores=dict(linear_avg=end))


def test_reach_pairs_seeds_at_the_lower_final_score():
    a = [along("on", 0, (50, 60), 62), along("on", 1, (50, 58), 62)]
    b = [along("off", 0, (50, 55), 60), along("off", 1, (50, 55), 60), along("off", 2, (50, 50), 50)]
    rows, ratio = report.reach(a, b, "linear_avg")
    # target 60, b's end, at both seeds both have (b's seed 2 has no pair). Seed 0: a is there at its 4M snapshot, b at
    # its end: 0.25. Seed 1: a halfway from 58 (4M) to 62 (16M), in log tokens 8M: 0.5
    assert [(k, t) for k, t, *_ in rows] == [(0, 60), (1, 60)]
    assert rows[0][2:] == (pytest.approx(4e6), pytest.approx(16e6), pytest.approx(0.25))
    assert rows[1][2:] == (pytest.approx(8e6), pytest.approx(16e6), pytest.approx(0.5))
    # the geometric mean, sqrt(0.125); the interval of the mean log ratio, t(1) = 12.71, sd ln 2 / sqrt 2
    m, hw = math.log(0.125) / 2, 12.71 * math.log(2) / 2
    assert ratio == f"{math.exp(m):.2f}x [{math.exp(m - hw):.2f}x, {math.exp(m + hw):.2f}x]" == "0.35x [0.00x, 28.94x]"
    assert report.reach(a[:1], b[:1], "linear_avg")[1] == "0.25x (1 seed)"


def test_cms_table_reads_tokens_to_reach_and_their_flops():
    def run(axis, seed, scores, end, flops_per_token, losses):
        r = along("crossbert", seed, scores, end)
        for p in r["trajectory"]:
            p["layers"]["1"]["knn_avg"] = p["layers"]["1"]["linear_avg"]
        log = [dict(tokens=t, val_loss=x) for t, x in zip((0, 1e6, 4e6, 16e6), losses)]  # step 0's is left out
        return dict(r, axis=axis, shape="2x128", flops=16e6 * flops_per_token, scores=dict(linear_avg=end, knn_avg=end),
                    log=log)
    # CMS on reaches off's final 60 at its 4M snapshot (seed 0) and at 8M (seed 1): 0.25 and 0.5 of off's 16M tokens;
    # each of its tokens costs 2x the FLOPs of off's, so the same point costs sqrt(0.125) x 2 of off's FLOPs. The val
    # loss: off ends at 4.6, which on's reaches at 4M, at both seeds (its step 0, below everything, does not count)
    on, off = (0.0, 5.0, 4.6, 4.4), (0.0, 5.0, 4.8, 4.6)
    results = [run("main", 0, (50, 60), 62, 2.0, on), run("main", 1, (50, 58), 62, 2.0, on),
               run("cms", 0, (50, 55), 60, 1.0, off), run("cms", 1, (50, 55), 60, 1.0, off)]
    table = report.cms_table(results)
    rows = [line for line in table.splitlines() if line.startswith("| 2x128")]
    assert len(rows) == 3 and "0: 4.0M / 16.0M = 0.25, 1: 8.0M / 16.0M = 0.50" in rows[0] and "| linear |" in rows[0]
    assert rows[0].endswith(f"| {math.sqrt(0.125) * 2:.2f}x |") and "0.35x [" in rows[0]
    assert "| val loss | 0: 4.0M / 16.0M = 0.25, 1: 4.0M / 16.0M = 0.25 |" in rows[2] and rows[2].endswith("| 0.50x |")
    assert report.cms_table([r for r in results if r["axis"] == "main"]) == ""  # no cms runs: no section


def one_view():
    """A run of the cms axis: snapshots at 1M and 4M input tokens (2M and 8M FLOPs), its end at 16M (32M FLOPs)."""
    r = dict(along("crossbert", 0, (50, 60), 62), axis="cms", shape="2x128", flops=32e6, val_loss=4.5)
    for p, flops in zip(r["trajectory"], (2e6, 8e6)):
        p.update(flops=flops)
        p["layers"]["1"]["knn_avg"] = p["layers"]["1"]["linear_avg"] - 10
    r["scores"]["knn_avg"] = 52
    return r


def test_cms_curves_follow_the_snapshots_to_the_end():
    assert report.cms_curves(one_view()) == dict(tokens=[1e6, 4e6, 16e6], flops=[2e6, 8e6, 32e6],
                                                 val_loss=[5.0, 5.0, 4.5], linear_avg=[50, 60, 62], knn_avg=[40, 50, 52])


@pytest.mark.slow  # a figure drawn: seconds of plumbing
def test_cms_plot_per_shape(tmp_path):
    pytest.importorskip("matplotlib")
    r = one_view()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    on = dict(r, axis="main", name="crossbert-2x128")
    assert report.plot_cms(plt, [on, r], tmp_path) == ["cms-2x128.png"]
    assert (tmp_path / "cms-2x128.png").stat().st_size > 20_000


def test_the_ablations_against_their_main_run_and_the_twins():
    def variant(axis, seed, lin, knn, **settings):
        r = run("crossbert", (2, 128), seed, 1, 4.9, lin, knn)
        return dict(r, axis=axis, name=r["name"] + "-" + axis, settings=dict(r["settings"], **settings))
    twins = [dict(run("crossbert", (2, 128), k, 1, None, 58, 55), axis="random") for k in range(2)]
    results = [run("crossbert", (2, 128), k, 1, 4.9, 60 + k, 50) for k in range(2)] + twins
    results += [variant("mask", k, 63, 51 + k, mask_ratio=0.75) for k in range(2)]
    results += [variant("mask", 0, 59, 52, mask_ratio=2 / 3, block_size=126), variant("predictor", 1, 62, 52, pred_layer=2)]
    rows = {r[3]: r[4:] for r in rows_of(report.ablation_table(results), "| 1.20e+14")}
    assert list(rows) == ["main: mask 0.5, 2 views, 1-block predictor", "mask 0.5, 2 views, 2-block predictor",
                          "mask 0.667, 3 views, 1-block predictor", "mask 0.75, 4 views, 1-block predictor"]
    main, deeper, two_thirds, three_quarters = rows.values()
    # the main run: seeds 0 and 1, itself minus the twins (60 - 58, 61 - 58 linear; 50 - 55 kNN)
    assert main == ["0, 1", "4.900 ± 0.000", "60.5 ± 0.7", "50.0 ± 0.0", "-", "-", "+2.5 [-3.9, +8.9]",
                    "-5.0 [-5.0, -5.0] |"]
    # 0.75 minus the main run paired by seed: 63 - 60, 63 - 61 linear; 51 - 50, 52 - 50 kNN
    assert three_quarters[4:6] == ["+2.5 [-3.9, +8.9]", "+1.5 [-4.9, +7.9]"]
    assert two_thirds[:1] + two_thirds[4:7] == ["0", "-1.0 (1 seed)", "+2.0 (1 seed)", "+1.0 (1 seed)"]
    assert deeper[:1] + deeper[4:6] == ["1", "+1.0 (1 seed)", "+2.0 (1 seed)"]  # seed 1's main run: 61 linear
    assert report.ablation_table([r for r in results if r["axis"] != "mask" and r["axis"] != "predictor"]) == ""


def bert_80_10_10(seed, lin):
    """A record of the replace axis: BERT 80/10/10 at 2 x 128, x0.5, val loss 3.85, kNN 50."""
    r = run("bert", (2, 128), seed, 0.5, 3.85, lin, 50)
    return dict(r, axis="replace", name=f"replace-{seed}", settings=dict(r["settings"], random_replace=True))


def test_the_replace_table_pairs_80_10_10_with_all_mask_bert_and_crossbert_at_its_own_rate(tmp_path):
    rs = grid()  # at 2 x 128 CrossBERT's own rate is x2 (lower val loss), all-<mask> BERT has x0.5 at seeds 0-1
    rs += [bert_80_10_10(k, 64 + 2 * k) for k in range(2)]
    # 80/10/10: +1 and +2 linear over all-<mask> at x0.5, kNN 1 lower
    rows = [line for line in report.replace_table(rs).splitlines() if line.startswith("| 1.20e+14")]
    assert len(rows) == 3
    mine, *against = rows
    assert "BERT 80/10/10 − all-<mask> BERT | x0.5 / x0.5 | 0, 1 |" in mine
    assert mine.endswith("| +1.5 [-4.9, +7.9] | -1.0 [-1.0, -1.0] |")  # the paired differences, t-interval of 2 pairs
    assert "3.850 ± 0.000 (6.400) vs 3.900 ± 0.000 (6.400)" in mine  # each side's val loss beside its unigram loss
    assert "CrossBERT − BERT 80/10/10 | x2 / x0.5 | 0, 1 |" in against[0]  # CrossBERT at its own chosen rate
    assert against[0].endswith("| +0.5 [-5.9, +6.9] | +2.0 [+2.0, +2.0] |")
    assert report.replace_table(grid()) == ""  # no runs of the axis, no table
    # the baseline in the own-rate comparisons: CrossBERT at its x2 minus BERT 80/10/10 at the x0.5 it ran at
    own = [line for line in report.own_lr(rs).splitlines() if "| crossbert − bert 80/10/10 | each its own |" in line]
    assert len(own) == 1 and own[0].endswith("| x2 / x0.5 | 2 | +0.5 [-5.9, +6.9] | +2.0 [+2.0, +2.0] | "
                                             "not distinguishable / above |")
    report.write_markdown(rs, tmp_path)
    assert "## BERT's corruption: 80/10/10 against all <mask>" in (tmp_path / "results.md").read_text()
    # the x1 table's bert is all-<mask> BERT: with 80/10/10 runs, it says where theirs are
    assert "BERT 80/10/10, the baseline, ran at its own learning rate" in report.summarize(rs)
    assert "80/10/10" not in report.summarize(grid())


@pytest.mark.slow  # figures drawn: seconds of plumbing
def test_the_plots_draw_bert_80_10_10_as_a_family_of_its_own(tmp_path):
    pytest.importorskip("matplotlib")
    rs = [r for r in grid() if r["axis"] == "lr"] + [bert_80_10_10(k, 64) for k in range(2)]  # no main runs
    rs = [dict(r, log=[dict(flops=r["flops"], val_loss=r["val_loss"])]) for r in rs]
    assert report.plots(rs, tmp_path) == ["val_loss_vs_flops.png", "lr-2x128.png", "lr-4x256.png"]
    assert (tmp_path / "lr-2x128.png").stat().st_size > 20_000
