"""The convergence study (kljax/studies): the closed-form optimum, the exact metrics logged by the
training loop against brute-force sums, an unbiased run closing the gap, and the CLI."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.cli import build_parser, main
from kljax.cli.converge_study import build_config
from kljax.rl.kl import KLConfig
from kljax.studies.converge import RunSettings, train_runs
from kljax.studies.fixed_point import find_fixed_points
from kljax.studies.study import StudyConfig
from kljax.tasks.exact_optimum import exact_metrics, make_task, objective, optimal_logp, task_logps


def _random_logp(rng: np.random.Generator, p: int, n: int, scale: float = 2.0) -> jnp.ndarray:
    return jax.nn.log_softmax(jnp.asarray(scale * rng.normal(size=(p, n))), axis=-1)


def test_optimum_maximizes_j_and_gap_identity_float64():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for beta in (0.05, 0.3, 1.0, 4.0):
            ref = _random_logp(rng, 3, 11)
            rewards = jnp.asarray(rng.uniform(-1, 2, size=(3, 11)))
            opt = optimal_logp(ref, rewards, beta)
            assert opt.dtype == jnp.float64
            j_opt = objective(opt, ref, rewards, beta)
            for _ in range(20):
                pi = _random_logp(rng, 3, 11)
                j = objective(pi, ref, rewards, beta)
                kl = jnp.mean(jnp.sum(jnp.exp(pi) * (pi - opt), -1))
                assert float(j_opt - j) == pytest.approx(float(beta * kl), abs=1e-10)
                assert float(j) < float(j_opt)
                m = exact_metrics(pi, ref, rewards, beta)
                assert float(m["gap"]) == pytest.approx(float(j_opt - j), abs=1e-10)
                assert float(m["J"]) == pytest.approx(float(j), abs=1e-10)
            # small perturbations of pi* lower J: it is a maximum, not only a stationary point
            for _ in range(5):
                near = jax.nn.log_softmax(opt + 1e-3 * jnp.asarray(rng.normal(size=opt.shape)), -1)
                assert float(objective(near, ref, rewards, beta)) < float(j_opt)


def _brute_force(task, params, beta: float) -> dict[str, float]:
    """Every response's probability by walking its prefix rows token by token, then plain sums."""
    logits = np.asarray(params["logits"], np.float64)
    ref_logits = np.asarray(task.ref_params["logits"], np.float64)
    v = task.policy.vocab

    def prob(table: np.ndarray, prompt: int, seq: list[int]) -> float:
        out, value, offset = 1.0, 0, 0
        for t, tok in enumerate(seq):
            row = table[prompt, offset + value]
            e = np.exp(row - row.max())
            out *= e[tok] / e.sum()
            offset += v**t
            value = value * v + tok
        return out

    totals = {"J": 0.0, "reward": 0.0, "kl_seq": 0.0, "gap": 0.0, "kl_opt": 0.0}
    for p in range(task.num_prompts):
        seqs = [list(row[m]) for row, m in zip(task.responses_nr, task.mask_nr, strict=True)]
        pi = np.array([prob(logits, p, s) for s in seqs])
        ref = np.array([prob(ref_logits, p, s) for s in seqs])
        r = task.rewards_pn[p]
        opt = ref * np.exp(r / beta)
        opt /= opt.sum()
        kl_seq = np.sum(pi * np.log(pi / ref))
        totals["J"] += np.sum(pi * r) - beta * kl_seq
        totals["reward"] += np.sum(pi * r)
        totals["kl_seq"] += kl_seq
        totals["gap"] += beta * np.sum(pi * np.log(pi / opt))
        totals["kl_opt"] += np.sum(opt * np.log(opt / pi))
    return {k: v / task.num_prompts for k, v in totals.items()}


def test_logged_metrics_equal_brute_force_and_unbiased_gap_decreases():
    task = make_task()
    run = RunSettings(steps=40, group_size=8, learning_rate=0.1, async_level=2)
    betas = np.array([0.3, 1.0])
    m, params = train_runs(task, KLConfig("k1", "reward"), run, betas, np.arange(2), return_params=True)
    assert m["gap"].shape == (41, 2, 2) and not np.any(m["nonfinite"])
    for i, beta in enumerate(betas):
        start = _brute_force(task, task.ref_params, beta)
        assert m["gap"][0, i, 0] == pytest.approx(start["gap"], rel=1e-4)
        for s in range(2):
            want = _brute_force(task, jax.tree.map(lambda x, i=i, s=s: x[i, s], params), beta)
            for k, value in want.items():
                assert m[k][-1, i, s] == pytest.approx(value, rel=1e-3, abs=1e-6), (k, beta, s)
        # the unbiased configuration closes most of the gap to pi* in 40 steps
        assert m["gap"][-1, i].max() < 0.25 * m["gap"][0, i].mean()


def test_fixed_points_unbiased_is_optimum_k3_loss_is_not():
    task = make_task()
    beta = 0.3
    ref_logp = task_logps(task, task.ref_params)
    initial = float(exact_metrics(ref_logp, ref_logp, task.rewards_pn, beta)["gap"])
    gaps = {}
    for name, kl in (("k1-reward", KLConfig("k1", "reward")), ("k3-loss", KLConfig("k3", "loss"))):
        fp = find_fixed_points(task, kl, [beta], iters=1500)
        logp = task_logps(task, jax.tree.map(lambda x: x[0], fp.params))
        gaps[name] = float(exact_metrics(logp, ref_logp, task.rewards_pn, beta)["gap"])
        assert not fp.diverges[0], name
    assert gaps["k1-reward"] < 1e-4 * initial
    assert gaps["k3-loss"] > 0.1 * initial  # the partial forward-KL fixed point is elsewhere


def test_cli_quick_reduced_writes_rows_and_report(tmp_path, capsys):
    out, rows_path = tmp_path / "study", tmp_path / "rows.json"
    rc = main(["converge-study", "--quick", "--presets", "k1-reward,k3-loss", "--betas", "0.3", "--async-levels",
               "0", "--steps", "5", "--out", str(out), "--json", str(rows_path), "--no-progress"])
    assert rc == 0
    rows = json.loads(rows_path.read_text())
    assert [r["name"] for r in rows] == ["k1-reward async=0 beta=0.3", "k3-loss async=0 beta=0.3"]
    for r in rows:
        assert {"name", "unbiased", "initial_gap", "final_gap_mean", "final_gap_std", "seeds"} <= set(r)
        assert r["seeds"] == 2 and r["initial_gap"] > 0 and np.isfinite(r["final_gap_mean"])
    assert [r["unbiased"] for r in rows] == [True, False]
    assert main(["report", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "Convergence to the known optimum" in text and "| k3-loss | 0 | biased |" in text
    assert (out / "gap_curves_async0.png").stat().st_size > 1000 and (out / "off_policy.png").is_file()
    # The report's rerun line parses back to the study's own configuration.
    meta = json.loads((out / "study.json").read_text())["meta"]
    rerun = next(line for line in text.splitlines() if line.startswith("Rerun: `"))[len("Rerun: `"):].split(" --out")[0]
    args, _ = build_parser().parse_known_args(rerun.split()[1:])
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in meta.items()
              if k in StudyConfig.__dataclass_fields__}
    assert build_config(args) == StudyConfig(**fields)
    # Without curves.json (a committed results folder) the report keeps the gap-curve figures it has,
    # and a notes.md beside it is appended.
    (out / "curves.json").unlink()
    (out / "notes.md").write_text("## Reading\n\nk3-loss settles elsewhere.\n")
    before = (out / "gap_curves_async0.png").read_bytes()
    assert main(["report", str(out)]) == 0 and (out / "gap_curves_async0.png").read_bytes() == before
    assert (out / "report.md").read_text().endswith("## Reading\n\nk3-loss settles elsewhere.\n")
    assert text.split("## Each configuration's fixed point")[1].count("| k3-loss |") == 1
    assert "Not computed" not in text
    capsys.readouterr()
    assert main(["converge-study", "--presets", "k9-reward", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "k9-reward" in err and "k1-reward" in err
    assert main(["converge-study", "--betas", "0", "--no-progress"]) == 2


def test_no_kl_rows_are_not_unbiased_for_j(tmp_path, capsys):
    """A row without a KL term follows grad E[R], not grad J = E[R] - beta KL_seq: --json says so (#38)."""
    rows_path = tmp_path / "rows.json"
    assert main(["converge-study", "--quick", "--presets", "none,k1-reward", "--betas", "0.3", "--async-levels", "0",
                 "--steps", "2", "--fixed-point-iters", "0", "--out", str(tmp_path / "s"), "--json", str(rows_path),
                 "--no-progress"]) == 0
    rows = {r["preset"]: r for r in json.loads(rows_path.read_text())}
    assert (rows["none"]["unbiased"], rows["none"]["verdict"]) == (False, "no KL")
    assert rows["k1-reward"]["unbiased"] and rows["k1-reward"]["verdict"] == "scaled"
    capsys.readouterr()
