"""Verdicts from intervals (jacap_lib.verdicts.intervals) against independent computations: a brute-force
paired bootstrap in numpy (percentile and BCa) on a fixed seed, an exact Wilcoxon signed-rank p by
enumerating all sign flips, Holm adjustments worked by hand, the verdict sentence at every branch and
boundary, and the planning functions' power against a brute-force simulation of the t test."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from jacap_lib.verdicts.intervals import (RatioInterval, compare_cells, detectable_ratio, geometric_mean_ratio, holm,
                                        log_ratios, mean_ratio, paired_power, verdict, wilcoxon_p)


def pair(n=40, shift=-0.08, seed=1):
    g = np.random.default_rng(seed)
    ref = g.lognormal(-2.0, 1.0, n)
    return ref * g.lognormal(shift, 0.15, n), ref


def brute_bootstrap(stat, m, r, *, B=40000, seed=123, bca=False, confidence=0.95):
    """Paired bootstrap by hand: resample document indices, keep each document's pair together."""
    n = m.size
    idx = np.random.default_rng(seed).integers(0, n, size=(B, n))
    boot = stat(m[idx], r[idx])
    est = stat(m[None], r[None])[0]
    a_lo, a_hi = (1 - confidence) / 2, (1 + confidence) / 2
    if not bca:
        return np.quantile(boot, [a_lo, a_hi])
    z0 = norm.ppf(np.mean(boot < est))
    keep = ~np.eye(n, dtype=bool)
    jack = np.array([stat(m[keep[i]][None], r[keep[i]][None])[0] for i in range(n)])
    dev = jack.mean() - jack
    acc = np.sum(dev ** 3) / (6 * np.sum(dev ** 2) ** 1.5)
    z = norm.ppf([a_lo, a_hi])
    q = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    return np.quantile(boot, q)


def gm_stat(m, r):
    return np.exp(np.mean(np.log(m / r), axis=-1))


def mean_stat(m, r):
    return m.mean(axis=-1) / r.mean(axis=-1)


@pytest.mark.parametrize("method", ["percentile", "BCa"])
@pytest.mark.parametrize("which", ["gm", "mean"])
def test_bootstrap_matches_brute_force(method, which):
    m, r = pair()
    fn, stat = (geometric_mean_ratio, gm_stat) if which == "gm" else (mean_ratio, mean_stat)
    got = fn(m, r, method=method, n_resamples=20000, seed=7)
    lo, hi = brute_bootstrap(stat, m, r, bca=method == "BCa")
    assert got.estimate == pytest.approx(stat(m[None], r[None])[0], rel=1e-12)
    width = hi - lo
    # Monte-Carlo tolerance: two independent bootstraps' quantiles differ by a few % of the width
    assert abs(got.low - lo) < 0.06 * width and abs(got.high - hi) < 0.06 * width
    assert got.low < got.estimate < got.high and got.method == method and got.n == m.size


def test_fixed_seed_is_reproducible_and_paired():
    m, r = pair()
    a, b = mean_ratio(m, r, seed=3), mean_ratio(m, r, seed=3)
    assert (a.low, a.high) == (b.low, b.high)
    # pairing matters: the same values with the documents shuffled in one array give a wider interval
    shuffled = mean_ratio(m, np.random.default_rng(0).permutation(r), seed=3)
    assert shuffled.high - shuffled.low > 1.5 * (a.high - a.low)


def test_constant_ratio_has_a_point_interval():
    r = np.array([0.1, 0.2, 0.5, 1.0])
    gm = geometric_mean_ratio(0.9 * r, r)
    assert gm.low == pytest.approx(0.9) and gm.high == pytest.approx(0.9) and gm.estimate == pytest.approx(0.9)
    assert verdict(gm) == "better by 10 %"


def test_wilcoxon_matches_exact_enumeration():
    m, r = pair(n=10, shift=-0.05, seed=4)
    d = np.log(m / r)
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    t_plus = ranks[d > 0].sum()
    t = min(t_plus, ranks.sum() - t_plus)
    null = np.array([sum(rk for rk, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=10)])
    exact = min(1.0, 2 * np.mean(null <= t))
    assert wilcoxon_p(m, r) == pytest.approx(exact, rel=1e-9)
    assert wilcoxon_p(r, r) == 1.0


@pytest.mark.parametrize("p, want", [
    ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),   # step-down with the running maximum
    ([0.02, 0.01, 0.04], [0.04, 0.03, 0.04]),
    ([0.5, 0.6], [1.0, 1.0]),                                 # capped at 1
    ([0.01, 0.01], [0.02, 0.02]),                             # ties
    ([0.2], [0.2]),                                           # a family of one
])
def test_holm_by_hand(p, want):
    got = holm(p)
    assert got == pytest.approx(want, abs=1e-12)
    assert np.all(got >= np.asarray(p)) and np.all(got <= np.minimum(1, len(p) * np.asarray(p)) + 1e-15)


@pytest.mark.parametrize("interval, sentence", [
    ((0.89, 0.94), "better by 6–11 %"),
    ((1.03, 1.09), "worse by 3–9 %"),
    ((0.96, 1.04), "no detectable difference; the interval is ±4 %"),
    ((0.97, 1.05), "no detectable difference; the interval is −3 % to +5 %"),
    ((0.95, 1.0), "no detectable difference; the interval is −5 % to 0 %"),      # hi == 1: not better
    ((1.0, 1.04), "no detectable difference; the interval is 0 % to +4 %"),      # lo == 1: not worse
    ((0.94, 0.9999), "better by 0.01–6.0 %"),                                    # just below 1
    ((1.0001, 1.2), "worse by 0.01–20 %"),
    ((0.995, 0.999), "better by 0.1–0.5 %"),                                      # decimals kept apart
    ((0.9, 0.9), "better by 10 %"),
    ((0.5, 2.0), "no detectable difference; the interval is −50 % to +100 %"),
])
def test_verdict_branches_and_boundaries(interval, sentence):
    assert verdict(interval) == sentence
    ri = RatioInterval("geometric-mean ratio", math.sqrt(interval[0] * interval[1]), *interval, 0.95, "BCa", 48, 9999, 0)
    assert verdict(ri) == sentence


@pytest.mark.parametrize("interval, match", [
    ((1.1, 0.9), "above high"), ((0.0, 1.0), "positive"), ((float("nan"), 1.0), "finite"),
    ((0.9, float("inf")), "finite"), ("ab", "RatioInterval"), (0.9, "RatioInterval"),
])
def test_verdict_bad_input(interval, match):
    with pytest.raises(ValueError, match=match):
        verdict(interval)


def test_bad_kl_input_names_the_argument():
    m, r = pair(n=6)
    with pytest.raises(ValueError, match="same length"):
        log_ratios(m, r[:5])
    with pytest.raises(ValueError, match="reference_kl must be positive"):
        geometric_mean_ratio(m, np.r_[r[:5], 0.0])
    with pytest.raises(ValueError, match="method_kl must be positive"):
        mean_ratio(np.r_[m[:5], -1.0], r)
    with pytest.raises(ValueError, match="method_kl has non-finite"):
        wilcoxon_p(np.r_[m[:5], np.nan], r)
    with pytest.raises(ValueError, match="reference_kl must be 1-D"):
        log_ratios(m, r.reshape(2, 3))
    with pytest.raises(ValueError, match="at least 3"):
        log_ratios(m[:2], r[:2])
    with pytest.raises(ValueError, match="confidence"):
        geometric_mean_ratio(m, r, confidence=95)
    with pytest.raises(ValueError, match="method must be"):
        mean_ratio(m, r, method="basic")
    with pytest.raises(ValueError, match="n_resamples"):
        mean_ratio(m, r, n_resamples=10)
    with pytest.raises(ValueError, match="p_values"):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError, match="p_values"):
        holm([])
    with pytest.raises(ValueError, match="cells"):
        compare_cells({})
    with pytest.raises(ValueError, match=r"cells\['a'\]"):
        compare_cells({"a": m})


def test_compare_cells_holm_over_the_family():
    cells = {"clear": pair(n=30, shift=-0.1, seed=1), "none": pair(n=30, shift=0.0, seed=2),
             "worse": pair(n=30, shift=0.15, seed=3)}
    rows = compare_cells(cells, n_resamples=2000)
    by = {row["cell"]: row for row in rows}
    p = [row["p_wilcoxon"] for row in rows]
    assert [row["p_holm"] for row in rows] == pytest.approx(holm(p).tolist())
    assert by["clear"]["verdict"].startswith("better by") and by["clear"]["holm_significant"]
    assert by["worse"]["verdict"].startswith("worse by")
    assert not by["none"]["holm_significant"]
    gm = geometric_mean_ratio(*cells["clear"], n_resamples=2000)
    assert (by["clear"]["gm_low"], by["clear"]["gm_high"]) == (gm.low, gm.high)
    assert by["clear"]["wins"] == int(np.sum(cells["clear"][0] < cells["clear"][1]))


def test_an_interval_that_is_the_null_point_says_identical():
    from jacap_lib.verdicts.intervals import geometric_mean_ratio, verdict

    assert verdict((1.0, 1.0)) == "no difference: identical on every document"
    assert verdict(geometric_mean_ratio([0.2, 0.5, 0.9], [0.2, 0.5, 0.9])) == "no difference: identical on every document"
    assert verdict((0.0, 0.0), scale="points") == "no difference: identical on every prompt"
    assert verdict((1.0, 1.0 + 1e-9)).startswith("no detectable difference")  # touching is not identical
    assert verdict(geometric_mean_ratio([0.4, 1.0, 1.8], [0.2, 0.5, 0.9])) == "worse by 100 %"  # constant ratio 2


# --------------------------------------------------------------------------------------------- the cells judged together
def test_simultaneous_level_is_bonferronis():
    from jacap_lib.verdicts.intervals import simultaneous_confidence

    assert simultaneous_confidence(0.95, 1) == 0.95
    assert simultaneous_confidence(0.95, 12) == pytest.approx(1 - 0.05 / 12, rel=1e-15)
    assert simultaneous_confidence(0.9, 4) == pytest.approx(0.975, rel=1e-15)
    for m in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="m must be"):
            simultaneous_confidence(0.95, m)


def test_adjusted_interval_holds_the_unadjusted_one_at_the_simultaneous_level():
    cells = {"a": pair(n=30, shift=-0.1, seed=1), "b": pair(n=30, shift=0.0, seed=2), "c": pair(n=30, shift=0.15, seed=3)}
    rows = compare_cells(cells, n_resamples=2000)
    for row in rows:
        assert row["cells_judged"] == 3 and row["confidence_adjusted"] == pytest.approx(1 - 0.05 / 3)
        assert row["gm_low_adjusted"] < row["gm_low"] < row["gm_ratio"] < row["gm_high"] < row["gm_high_adjusted"]
        one = geometric_mean_ratio(*cells[row["cell"]], n_resamples=2000, confidence=1 - 0.05 / 3)
        assert (row["gm_low_adjusted"], row["gm_high_adjusted"]) == (one.low, one.high)
        assert row["verdict"] == verdict((one.low, one.high))
        assert row["verdict_unadjusted"] == verdict((row["gm_low"], row["gm_high"]))


def test_adjusted_level_matches_a_brute_force_bootstrap():
    """The adjusted interval is the percentile bootstrap at 1 - 0.05/m, by an independent numpy bootstrap."""
    cells = {f"c{i}": pair(seed=i) for i in range(4)}
    row = compare_cells(cells, method="percentile", n_resamples=20000, seed=7)[0]
    lo, hi = brute_bootstrap(gm_stat, *cells["c0"], confidence=1 - 0.05 / 4)
    width = hi - lo
    assert abs(row["gm_low_adjusted"] - lo) < 0.06 * width and abs(row["gm_high_adjusted"] - hi) < 0.06 * width


def test_one_cell_adjusted_and_unadjusted_coincide():
    (row,) = compare_cells({"only": pair(n=30, shift=-0.1, seed=1)}, n_resamples=2000)
    assert row["cells_judged"] == 1 and row["confidence_adjusted"] == 0.95
    assert (row["gm_low_adjusted"], row["gm_high_adjusted"]) == (row["gm_low"], row["gm_high"])
    assert row["verdict"] == row["verdict_unadjusted"]


def test_better_alone_is_no_detectable_difference_among_twelve_cells():
    """A hand-built cell: 12 documents whose log ratios are -0.08 + 0.12 u, u a fixed pattern of mean 0 and
    standard deviation 1, so the mean log ratio is 0.08 / (0.12 / sqrt(12)) = 2.3 standard errors below 0: its
    own 95 % interval (1.96 SE) lies below 1, the interval for 12 cells at once (1 - 0.05/12: 2.87 SE) does not.
    The other 11 cells: ratios spread symmetrically around 1."""
    u = np.linspace(-1, 1, 12)
    u = (u - u.mean()) / u.std()
    ref = np.linspace(0.05, 0.6, 12)
    cells = {"judged": (ref * np.exp(-0.08 + 0.12 * u), ref)}
    for i in range(11):
        cells[f"null{i}"] = (ref * np.exp(0.1 * np.roll(u, i)), ref)
    rows = {r["cell"]: r for r in compare_cells(cells)}
    r = rows["judged"]
    assert r["gm_ratio"] == pytest.approx(math.exp(-0.08))
    assert r["gm_high"] < 1 < r["gm_high_adjusted"]
    assert r["verdict_unadjusted"].startswith("better by")
    assert r["verdict"].startswith("no detectable difference")
    # alone (m = 1) the same cell keeps its 95 % verdict
    (alone,) = compare_cells({"judged": cells["judged"]})
    assert alone["verdict"] == r["verdict_unadjusted"]


@pytest.mark.parametrize("wins, losses, p, want", [
    (7, 0, 0.047, "better"), (0, 6, 0.03, "worse"), (0, 6, 0.0625, "no detectable difference"),
    (3, 3, 0.01, "no detectable difference"), (0, 0, 1.0, "no difference: identical on every prompt"),
    (5, 0, 0.05, "better"),  # at alpha: rejected, as holm_significant (p <= alpha)
])
def test_mcnemar_verdict_branches(wins, losses, p, want):
    from jacap_lib.verdicts.intervals import mcnemar_verdict

    assert mcnemar_verdict(wins, losses, p) == want


@pytest.mark.parametrize("args, match", [((-1, 2, 0.5), "wins"), ((1, 2.5, 0.5), "losses"), ((1, 2, 1.5), "p_adjusted")])
def test_mcnemar_verdict_bad_input(args, match):
    from jacap_lib.verdicts.intervals import mcnemar_verdict

    with pytest.raises(ValueError, match=match):
        mcnemar_verdict(*args)


# ----------------------------------------------------------------------------------------------- planning
def _simulated_power(log_effect, sd, n, m, alpha=0.05, trials=40_000, seed=0):
    """Brute force: draw ``trials`` sets of n normal log ratios, run the two-sided one-sample t test at
    alpha/m on each (the t statistic and Student's critical value computed here), count the rejections."""
    from scipy.stats import t as student

    d = np.random.default_rng(seed).normal(log_effect, sd, size=(trials, n))
    stat = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(stat) > student.isf(alpha / m / 2, n - 1)))


@pytest.mark.parametrize("sd,n,m", [(0.5, 48, 48), (1.2, 96, 24), (0.3, 12, 1)])
def test_detectable_ratio_has_its_power_in_a_brute_force_simulation(sd, n, m):
    r = detectable_ratio(sd, n, m)
    assert 0 < r < 1
    # 40,000 trials: the simulated power's standard error is 0.002, so 0.8 +- 0.01 is five of them
    assert abs(_simulated_power(math.log(r), sd, n, m) - 0.8) < 0.01
    assert abs(_simulated_power(-math.log(r), sd, n, m, seed=1) - 0.8) < 0.01  # a ratio of 1/r: the same
    # an effect half as large is detected far less often; no effect is rejected at the Bonferroni level
    assert _simulated_power(math.log(r) / 2, sd, n, m) < 0.6
    assert abs(_simulated_power(0.0, sd, n, m) - 0.05 / m) < 0.006
    assert paired_power(0.0, sd, n, m) == pytest.approx(0.05 / m)
    assert paired_power(math.log(r), sd, n, m) == pytest.approx(0.8, abs=1e-9)


def test_detectable_ratio_normal_approximation_and_monotone():
    sd, m = 0.7, 48
    for n in (48, 96, 144):
        delta = (norm.isf(0.05 / m / 2) + norm.isf(0.2)) * sd / math.sqrt(n)  # the textbook closed form
        assert detectable_ratio(sd, n, m, approximation="normal") == pytest.approx(math.exp(-delta), rel=1e-9)
        # the t test needs a larger effect than the normal approximation says (fatter tails, estimated sd)
        assert detectable_ratio(sd, n, m) < detectable_ratio(sd, n, m, approximation="normal")
    ratios = [detectable_ratio(sd, n, m) for n in (48, 96, 144)]
    assert ratios[0] < ratios[1] < ratios[2] < 1                      # more documents: closer to 1
    assert detectable_ratio(sd, 96, 24) > detectable_ratio(sd, 96, 48)  # fewer comparisons: closer to 1
    assert detectable_ratio(sd, 96, 48, power=0.9) < detectable_ratio(sd, 96, 48)


@pytest.mark.parametrize("kwargs,match", [({"log_ratio_sd": 0.0}, "log_ratio_sd"), ({"log_ratio_sd": float("nan")},
                                          "log_ratio_sd"), ({"n": 1}, "n must"), ({"n": 9.5}, "n must"),
                                          ({"m": 0}, "m must"), ({"power": 1.0}, "power"),
                                          ({"power": 0.0001}, "power"), ({"approximation": "z"}, "approximation")])
def test_detectable_ratio_bad_input(kwargs, match):
    args = {"log_ratio_sd": 0.5, "n": 48, "m": 48, **kwargs}
    with pytest.raises(ValueError, match=match):
        detectable_ratio(**args)


def brute_work_bootstrap(d, labels, *, B=40000, seed=5, bca=False, confidence=0.95):
    """Works resampled by hand: draw works with replacement, pool every document of the drawn works, take the mean
    log ratio; BCa's acceleration from leaving out one work at a time."""
    names = sorted(set(labels))
    per = [d[labels == w] for w in names]
    k = len(names)
    idx = np.random.default_rng(seed).integers(0, k, size=(B, k))
    sums, counts = np.array([p.sum() for p in per]), np.array([p.size for p in per], dtype=float)
    boot = sums[idx].sum(1) / counts[idx].sum(1)
    est = d.mean()
    a = np.array([(1 - confidence) / 2, (1 + confidence) / 2])
    if bca:
        z0 = norm.ppf(np.mean(boot < est))
        jack = np.array([(sums.sum() - sums[i]) / (counts.sum() - counts[i]) for i in range(k)])
        dev = jack.mean() - jack
        acc = np.sum(dev ** 3) / (6 * np.sum(dev ** 2) ** 1.5)
        z = norm.ppf(a)
        a = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    return np.exp(np.quantile(boot, a))


@pytest.mark.parametrize("method", ["percentile", "BCa"])
def test_work_ratio_resamples_works(method):
    from jacap_lib.verdicts.intervals import work_ratio

    g = np.random.default_rng(3)
    labels = np.array([f"w{i}" for i in range(12) for _ in range(1 + i % 3)])  # 12 works of 1-3 excerpts
    work_effect = {f"w{i}": g.normal(-0.1, 0.3) for i in range(12)}  # excerpts of a work move together
    ref = g.lognormal(-2.0, 1.0, labels.size)
    m = ref * np.exp(np.array([work_effect[w] for w in labels]) + g.normal(0, 0.05, labels.size))
    got = work_ratio(m, ref, labels, method=method, n_resamples=20000, seed=7)
    lo, hi = brute_work_bootstrap(np.log(m / ref), labels, bca=method == "BCa")
    assert got.estimate == pytest.approx(geometric_mean_ratio(m, ref).estimate, rel=1e-12)
    assert got.n == 12 and abs(got.low - lo) < 0.06 * (hi - lo) and abs(got.high - hi) < 0.06 * (hi - lo)
    # the documents' bootstrap treats the 24 excerpts as independent: its interval is narrower than the works'
    docs = geometric_mean_ratio(m, ref, method=method, n_resamples=20000, seed=7)
    assert docs.high - docs.low < got.high - got.low
    # one document per work: the works' bootstrap is the documents' (same draws, same statistic)
    single = np.array([f"d{i}" for i in range(labels.size)])
    a = work_ratio(m, ref, single, method=method, n_resamples=2000, seed=1)
    b = geometric_mean_ratio(m, ref, method=method, n_resamples=2000, seed=1)
    assert abs(a.low - b.low) < 0.06 * (b.high - b.low) and abs(a.high - b.high) < 0.06 * (b.high - b.low)
    with pytest.raises(ValueError, match="one label per document"):
        work_ratio(m, ref, labels[:-1])
    with pytest.raises(ValueError, match="at least 3 works"):
        work_ratio(m[:3], ref[:3], ["a", "a", "b"])
