"""The evaluation's intervals against known cases: Wilson's formula on fixed counts, the cluster
bootstrap's coverage on simulated problems, the paired change on the same problems."""

import dataclasses

import numpy as np
import pytest

from kljax.train import intervals as iv

# Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I (Wilson, method 3)
NEWCOMBE = [((81, 263), (0.2553, 0.3662)), ((15, 148), (0.0624, 0.1605)), ((0, 20), (0.0, 0.1611)),
            ((1, 29), (0.0061, 0.1718))]


@pytest.mark.parametrize("counts, expected", NEWCOMBE)
def test_wilson_matches_published_values(counts, expected):
    lo, hi = iv.wilson_interval(*counts)
    assert lo == pytest.approx(expected[0], abs=5e-5) and hi == pytest.approx(expected[1], abs=5e-5)


@pytest.mark.parametrize("s, n", [(0, 10), (5, 10), (10, 10), (1, 32), (400, 500)])
def test_wilson_is_the_closed_form(s, n):
    """The interval's ends are the roots in p of (p_hat - p)^2 = z^2 p (1 - p) / n."""
    lo, hi = iv.wilson_interval(s, n)
    p_hat, z2 = s / n, iv.Z95**2
    for end in (lo, hi):
        assert (p_hat - end) ** 2 == pytest.approx(z2 * end * (1 - end) / n, abs=1e-12)
    assert lo <= p_hat <= hi
    scipy_stats = pytest.importorskip("scipy.stats")
    ref = scipy_stats.binomtest(s, n).proportion_ci(method="wilson")
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_wilson_rejects_bad_counts():
    for s, n in ((3, 2), (-1, 4), (0, 0)):
        with pytest.raises(ValueError, match="successes"):
            iv.wilson_interval(s, n)


def _simulated_problems(rng, problems, k):
    """k Bernoulli samples of each problem, its own success probability from Beta(0.3, 1.2): most
    problems hard, a few easy (strongly correlated samples, as a model's answers are). True mean 0.2."""
    p_p = rng.beta(0.3, 1.2, size=problems)
    return rng.random((problems, k)) < p_p[:, None]


def test_cluster_bootstrap_covers_the_true_mean():
    """Over 300 simulated evaluations (200 problems x 4 samples) the 95% interval holds the true mean
    0.2 in 0.92-0.98 of them; an interval that counts the 800 samples as independent holds it far
    less often, which is why the problem is the unit."""
    rng = np.random.default_rng(0)
    hits = naive_hits = 0
    trials = 300
    for t in range(trials):
        correct = _simulated_problems(rng, 200, 4)
        lo, hi = iv.cluster_bootstrap_interval(correct, seed=t, n_boot=1000)
        hits += lo <= 0.2 <= hi
        nlo, nhi = iv.wilson_interval(int(correct.sum()), correct.size)
        naive_hits += nlo <= 0.2 <= nhi
    assert 0.92 <= hits / trials <= 0.98
    assert naive_hits / trials < 0.85


def test_paired_change_covers_the_true_change_and_pairs_problems():
    """A change of +0.1 on every problem: the paired interval covers 0.1 in 0.92-0.98 of 300 trials
    and is much narrower than the unpaired spread (the problems' difficulty cancels)."""
    rng = np.random.default_rng(1)
    hits, widths = 0, []
    for t in range(300):
        p_p = rng.beta(0.5, 1.5, size=150) * 0.8
        before = rng.random((150, 4)) < p_p[:, None]
        after = rng.random((150, 4)) < (p_p + 0.1)[:, None]
        change = iv.paired_change(before, after, seed=t, n_boot=1000)
        assert change["diff"] == pytest.approx(after.mean() - before.mean())
        lo, hi = change["ci95"]
        hits += lo <= 0.1 <= hi
        widths.append(hi - lo)
    assert 0.92 <= hits / 300 <= 0.98
    unpaired = 2 * iv.Z95 * np.sqrt(2 * 0.25 * 0.75 / 150)  # two independent samples of 150 problems
    assert np.mean(widths) < 0.8 * unpaired


def test_paired_change_uses_the_same_problems():
    """Row i is problem i in both: reordering one side changes the interval, and different numbers of
    problems are refused."""
    rng = np.random.default_rng(2)
    p_p = rng.beta(0.5, 1.0, size=100)
    before = rng.random((100, 4)) < p_p[:, None]
    after = before.copy()
    after[:10] = True  # 10 problems improve
    paired = iv.paired_change(before, after, seed=0)
    shuffled = iv.paired_change(before, after[rng.permutation(100)], seed=0)
    assert paired["diff"] == pytest.approx(shuffled["diff"])  # the mean does not see the pairing...
    assert paired["ci95"][0] > 0  # ...the interval does: only the improved problems move
    assert (paired["ci95"][1] - paired["ci95"][0]) < 0.7 * (shuffled["ci95"][1] - shuffled["ci95"][0])
    with pytest.raises(ValueError, match="same problems"):
        iv.paired_change(before, after[:99], seed=0)


def test_bootstrap_is_reproducible_and_seeded():
    correct = np.random.default_rng(3).random((64, 4))  # continuous values: each resample's quantile differs
    assert iv.cluster_bootstrap_interval(correct, seed=5) == iv.cluster_bootstrap_interval(correct, seed=5)
    assert iv.cluster_bootstrap_interval(correct, seed=5) != iv.cluster_bootstrap_interval(correct, seed=6)


def test_accuracy_entry_fields_and_degenerate_cases():
    greedy = np.array([1, 0, 0, 1, 0, 0, 0, 0], bool)
    entry = iv.accuracy_entry(greedy)
    assert entry == {"accuracy": 0.25, "ci95": list(iv.wilson_interval(2, 8)), "n": 8}
    none_right = np.zeros((32, 4), bool)  # every problem wrong: resamples cannot vary; Wilson on 32 problems
    assert iv.accuracy_entry(none_right)["ci95"] == list(iv.wilson_interval(0, 32))
    sampled = iv.accuracy_entry(_simulated_problems(np.random.default_rng(4), 50, 4))
    assert sampled["n"] == 50 and sampled["ci95"][0] <= sampled["accuracy"] <= sampled["ci95"][1]


def test_paired_deltas_pair_only_the_same_problems():
    """An evaluation's change is computed for the splits whose problems (ids, in order) are the ones
    before; a split with other problems, or none recorded, gets no change."""
    from kljax.train.evaluate_loop import paired_deltas

    def entry(ids, greedy, sampled):
        return {"problems": {"ids": ids, "greedy": greedy, "sampled": sampled}}

    before = {"a": entry(["p1", "p2", "p3"], [0, 0, 1], [[0, 1], [0, 0], [1, 1]]),
              "b": entry(["p1", "p2"], [0, 1], [[0, 0], [1, 1]]), "c": {"accuracy": 0.5}}
    after = {"a": entry(["p1", "p2", "p3"], [1, 0, 1], [[1, 1], [0, 1], [1, 1]]),
             "b": entry(["p2", "p1"], [1, 1], [[1, 1], [1, 1]]), "c": entry(["p1"], [1], [[1, 1]])}
    deltas = paired_deltas(before, after, seed=0)
    assert set(deltas) == {"a"}
    assert deltas["a"]["greedy"]["diff"] == pytest.approx(1 / 3)
    assert deltas["a"]["sampled"]["diff"] == pytest.approx((0.5 + 0.5 + 0) / 3)


def test_a_split_without_answers_is_scored_by_its_reward():
    """User data whose rows have no answer to check: accuracy means nothing, so the entry carries the
    mean reward greedy and sampled with bootstrap intervals, paired before/after, and the end-of-run
    table shows those rows (the README's Python API example: reward 0.33 -> 1.0, accuracy 0 -> 0)."""
    from kljax.train import evaluate_loop as el
    from kljax.train.eval_table import change_table

    plan = el.EvalPlan(splits=("test",), n_examples=6, seed=0, samples=2, temperature=0.8, max_prompt_len=8,
                       max_new_tokens=4, rows_per_call=3, prompt_format="raw")

    def outcome(greedy, sampled):
        p = len(greedy)
        return el.SplitOutcome([str(i) for i in range(p)], np.zeros(p, bool), np.asarray(greedy, np.float32),
                               np.zeros((p, 2), bool), np.asarray(sampled, np.float32), {}, [""] * p, checked=False)

    before = el.summarize({"test": outcome([0, 0, 1, 0, 0, 0], [[0, 0]] * 5 + [[1, 0]])}, plan)
    after = el.with_deltas(before, el.summarize({"test": outcome([1, 1, 1, 1, 0, 1], [[1, 1]] * 5 + [[1, 0]])}, plan),
                           plan.seed)
    entry = after["test"]
    assert entry["scored_by"] == "reward" and entry["reward_greedy"]["mean"] == pytest.approx(5 / 6)
    assert entry["reward_sampled"]["mean"] == pytest.approx(11 / 12) and entry["reward_sampled"]["k"] == 2
    change = entry["delta_vs_before"]["reward_sampled"]
    assert change["diff"] == pytest.approx(11 / 12 - 1 / 12) and change["ci95"][0] > 0
    table = "\n".join(change_table(before, after))
    assert "reward, greedy" in table and "reward, sampled T=0.8" in table and "no answers" in table
    checked = el.summarize({"test": dataclasses.replace(outcome([1], [[1, 0]]), checked=True)}, plan)["test"]
    assert "scored_by" not in checked and "reward_greedy" not in checked
