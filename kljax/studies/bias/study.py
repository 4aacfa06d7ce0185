"""The gradient-bias study: every KL configuration's exact and Monte-Carlo gradient statistics in a
toy RL setting, as a table plus figure records (see configs/bias_default.py for the fields).

`run_study(config)` returns a dict:
  settings  the configuration used and facts about the setting (KL_seq, reward, parameters, the
            sampler's distance KL(pi_theta || mu) at each staleness);
  table     one entry per studied configuration: describe()'s claim next to the measurement
            (relative bias, variance and MSE of a B-sample batch estimate, cosine with grad KL_seq),
            on-policy and with the sampler `staleness` steps stale, exact and/or Monte Carlo;
  offpolicy the bias/variance trade-off of sequence weights (plain, truncated) vs token ratios;
  records   long-format rows, one per (figure, configuration, x value): vs_length, vs_samples,
            vs_staleness, vs_alpha, vs_beta, rao_blackwell;
  timing    wall seconds per stage.
Everything runs in float64 (`jax.enable_x64`); "unbiased" in exact mode means relative bias < 1e-6.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from kljax.rl.kl import KLConfig
from kljax.studies.bias import catalog
from kljax.studies.bias.engine import Engine
from kljax.studies.bias.gradients import Moments, stats_from_moments, total_loss_stats
from kljax.studies.bias.montecarlo import check_samples, monte_carlo
from kljax.studies.bias.policies import POLICY_KINDS, check_enumeration, make_policy
from kljax.studies.bias.setting import OPTIMIZERS, make_setting
from kljax.verdicts.kl import config_name, describe
from kljax.verdicts.presets import PRESETS

MODES = ("exact", "montecarlo", "both")
UNBIASED_TOL = 1e-6
PRESET_NOTES = {config_name(c): note for c, note in PRESETS}


def _ints(name: str, values: Any, lo: int, hi: int | None = None) -> tuple[int, ...]:
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    for v in values:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"{name} has {v!r}; each value must be an integer in {rng}")
    return tuple(int(v) for v in values)


def _floats(name: str, values: Any, lo: float, hi: float | None = None, open_lo: bool = False) -> tuple[float, ...]:
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    for v in values:
        bad = not isinstance(v, (int, float)) or (v <= lo if open_lo else v < lo) or (hi is not None and v > hi)
        if bad:
            rng = f"{'>' if open_lo else '>='} {lo}" + (f" and <= {hi}" if hi is not None else "")
            raise ValueError(f"{name} has {v!r}; each value must be a number {rng}")
    return tuple(float(v) for v in values)


def validate(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Check a study config (ConfigDict or dict); return a plain dict of normalized values.
    Every error names the field, the bad value and the valid range."""
    c = dict(cfg)
    if c["policy"] not in POLICY_KINDS:
        raise ValueError(f"policy={c['policy']!r} is unknown; valid policies: {list(POLICY_KINDS)}")
    if c["mode"] not in MODES:
        raise ValueError(f"mode={c['mode']!r} is unknown; valid modes: {list(MODES)}")
    if c["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer={c['optimizer']!r} is unknown; valid optimizers: {list(OPTIMIZERS)}")
    make_policy(c["policy"], c["vocab"], c["length"])  # vocab / length ranges
    check_samples(c["samples"], c["repeats"])
    c["lengths"] = _ints("lengths", c["lengths"], 1, c["length"])
    c["sample_counts"] = _ints("sample_counts", c["sample_counts"], 1)
    c["train_steps"] = _ints("train_steps", c["train_steps"], 0)[0]
    c["staleness"] = _ints("staleness", c["staleness"], 0, c["train_steps"])[0]
    c["staleness_steps"] = _ints("staleness_steps", c["staleness_steps"], 0, c["train_steps"])
    c["alphas"] = _floats("alphas", c["alphas"], 0.0, 1.0)
    c["betas"] = _floats("betas", c["betas"], 0.0)
    c["truncations"] = _floats("truncations", c["truncations"], 1.0, open_lo=True)
    c["beta"] = _floats("beta", c["beta"], 0.0)[0]
    c["learning_rate"] = _floats("learning_rate", c["learning_rate"], 0.0, open_lo=True)[0]
    c["drift"] = _floats("drift", c["drift"], 0.0)[0]
    c["memory_budget_gb"] = _floats("memory_budget_gb", c["memory_budget_gb"], 0.0, open_lo=True)[0]
    c["chunk_size"] = _ints("chunk_size", c["chunk_size"], 1)[0]
    c["mc_chunk_size"] = _ints("mc_chunk_size", c.get("mc_chunk_size", 4096), 1)[0]
    c["kl_configs"] = catalog.resolve(c["configs"], c["truncations"])
    c["transformer"] = dict(c.get("transformer") or {})
    return c


def _records(figure: str, names: list[str], stats: Mapping[str, np.ndarray], mode: str, **coords: Any) -> list[dict]:
    out = []
    for i, name in enumerate(names):
        row = {"figure": figure, "config": name, "mode": mode, **coords}
        for key, values in stats.items():
            v = values[i]
            row[key] = bool(v) if isinstance(v, (bool, np.bool_)) else float(v)
        out.append(row)
    return out


def _verdict(relative_bias: float, cosine: float, unbiased: bool) -> str:
    if unbiased:
        return "unbiased"
    if cosine == 0.0 and abs(relative_bias - 1.0) < 1e-6:
        return "no KL gradient"
    return "biased"


class _Tasks:
    """A tqdm progress bar over named stages, with wall time per stage."""

    def __init__(self, total: int, progress: bool) -> None:
        self.bar = tqdm(total=total, disable=not progress, desc="bias-study", unit="step", leave=False)
        self.timing: dict[str, float] = {}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        self.bar.set_postfix_str(name)
        start = time.perf_counter()
        out = fn()
        self.timing[name] = self.timing.get(name, 0.0) + time.perf_counter() - start
        self.bar.update(1)
        return out

    def close(self) -> None:
        self.bar.close()


def build(c: Mapping[str, Any]) -> tuple[Engine, tuple[KLConfig, ...]]:
    """The setting and engine of a validated config: (engine, the table's configurations)."""
    policy = make_policy(
        c["policy"], c["vocab"], c["length"], **(c["transformer"] if c["policy"] == "transformer" else {})
    )
    table = c["kl_configs"]
    every = catalog.dedupe(table + catalog.offpolicy_configs(c["truncations"]) + catalog.rao_blackwell_configs())
    check_enumeration(  # before training the setting, which enumerates too
        c["vocab"],
        c["length"],
        len(every) + 1,
        policy.num_params(),
        8,
        c["memory_budget_gb"] * 2**30,
        rows=max(min(c["chunk_size"], c["vocab"] ** c["length"]), c["mc_chunk_size"]),
    )
    max_stale = max((c["staleness"], *c["staleness_steps"]))
    setting = make_setting(
        policy,
        c["seed"],
        drift=c["drift"],
        train_steps=c["train_steps"],
        max_staleness=max_stale,
        beta=c["beta"],
        learning_rate=c["learning_rate"],
        optimizer=c["optimizer"],
    )
    return Engine(setting, every, c["chunk_size"], c["memory_budget_gb"], c["mc_chunk_size"]), table


def run_study(cfg: Mapping[str, Any], progress: bool = False) -> dict[str, Any]:
    """Run the whole study described by `cfg` (see module doc); returns the result dict."""
    start = time.perf_counter()
    c = validate(cfg)
    exact, mc = c["mode"] in ("exact", "both"), c["mode"] in ("montecarlo", "both")
    b, key = c["samples"], jax.random.PRNGKey(c["seed"] + 1)
    with jax.enable_x64(True):
        n_tasks = 3 + len(c["lengths"]) * (exact + mc) + len(c["staleness_steps"]) * (exact + mc)
        n_tasks += len(c["alphas"]) * exact + len(c["sample_counts"]) * mc + 2 * mc
        tasks = _Tasks(n_tasks, progress)
        engine, table_cfgs = tasks.run("setting", lambda: build(c))
        setting, names = engine.setting, [config_name(x) for x in engine.configs]
        truth = tasks.run("truth", engine.truth)
        records: list[dict] = []
        exact_cache: dict[tuple, Moments] = {}

        def exact_at(kind: str, value: Any, length: int) -> Moments:
            if (kind, value, length) not in exact_cache:
                beh = setting.stale(value) if kind == "stale" else setting.interpolated(value)
                if kind == "alpha" and value == 0.0:
                    beh = setting.stale(0)
                exact_cache[(kind, value, length)] = engine.exact(beh, length)
            return exact_cache[(kind, value, length)]

        def mc_at(behaviour: Any, samples: int, length: int, tag: int) -> dict[str, np.ndarray]:
            return monte_carlo(engine, behaviour, jax.random.fold_in(key, tag), samples, c["repeats"], length).stats()

        on = tasks.run("exact table", lambda: exact_at("stale", 0, c["length"])) if exact else None
        stale_kl = {n: engine.kl_between(setting.stale(n)) for n in sorted({c["staleness"], *c["staleness_steps"]})}
        # Sequence length.
        for t in c["lengths"]:
            if exact:
                m = tasks.run("exact vs length", lambda t=t: exact_at("stale", 0, t))
                records += _records(
                    "vs_length",
                    names,
                    stats_from_moments(m, engine.truth(t)["kl_grad"], b),
                    "exact",
                    length=t,
                    samples=b,
                    staleness=0,
                )
            if mc:
                s = tasks.run("MC vs length", lambda t=t: mc_at(setting.stale(0), b, t, 100 + t))
                records += _records("vs_length", names, s, "montecarlo", length=t, samples=b, staleness=0)
        # Staleness (sampler = theta from N optimizer steps earlier).
        for n in c["staleness_steps"]:
            coords = dict(length=c["length"], samples=b, staleness=n, sampler_kl=stale_kl[n])
            if exact:
                m = tasks.run("exact vs staleness", lambda n=n: exact_at("stale", n, c["length"]))
                records += _records(
                    "vs_staleness", names, stats_from_moments(m, truth["kl_grad"], b), "exact", **coords
                )
            if mc:
                s = tasks.run("MC vs staleness", lambda n=n: mc_at(setting.stale(n), b, c["length"], 200 + n))
                records += _records("vs_staleness", names, s, "montecarlo", **coords)
        # Interpolated sampler (logit space).
        for a in c["alphas"] if exact else ():
            m = tasks.run("exact vs alpha", lambda a=a: exact_at("alpha", a, c["length"]))
            beh_kl = engine.kl_between(setting.interpolated(a)) if a else 0.0
            records += _records(
                "vs_alpha",
                names,
                stats_from_moments(m, truth["kl_grad"], b),
                "exact",
                length=c["length"],
                samples=b,
                alpha=a,
                sampler_kl=beh_kl,
            )
        # Number of samples: exact is analytic in B; Monte Carlo draws R batches of each size.
        for bb in c["sample_counts"]:
            if exact:
                records += _records(
                    "vs_samples",
                    names,
                    stats_from_moments(on, truth["kl_grad"], bb),
                    "exact",
                    length=c["length"],
                    samples=bb,
                    staleness=0,
                )
            if mc:
                s = tasks.run("MC vs samples", lambda bb=bb: mc_at(setting.stale(0), bb, c["length"], 300 + bb))
                records += _records("vs_samples", names, s, "montecarlo", length=c["length"], samples=bb, staleness=0)
        # Beta: the whole RL loss gradient (REINFORCE + beta * KL part), exact.
        for beta in c["betas"] if exact else ():
            s = total_loss_stats(on, truth["kl_grad"], truth["reward_loss_grad"], beta, b)
            records += _records("vs_beta", names, s, "exact", length=c["length"], samples=b, beta=beta)
        mc_on = tasks.run("MC table", lambda: mc_at(setting.stale(0), b, c["length"], 1)) if mc else None
        mc_off = (
            tasks.run("MC off-policy", lambda: mc_at(setting.stale(c["staleness"]), b, c["length"], 2)) if mc else None
        )
        off = exact_at("stale", c["staleness"], c["length"]) if exact else None
        tasks.close()

        result = {
            "settings": _settings(c, engine, truth, stale_kl),
            "records": records + _rao_blackwell(records),
        }
        result["table"] = _table(c, engine, table_cfgs, truth, on, off, mc_on, mc_off)
        result["offpolicy"] = _offpolicy(c, engine, truth, off, mc_off)
        result["timing"] = {
            **{k: round(v, 3) for k, v in tasks.timing.items()},
            "total_s": round(time.perf_counter() - start, 3),
        }
    return result


def _settings(c: Mapping[str, Any], engine: Engine, truth: Mapping[str, Any], stale_kl: Mapping[int, float]) -> dict:
    keep = {k: v for k, v in c.items() if k != "kl_configs"}
    return {
        **keep,
        "configs": [config_name(x) for x in c["kl_configs"]],
        "n_params": engine.n_params,
        "n_sequences": int(engine.seqs.shape[0]),
        "kl_theta_ref": truth["kl"],
        "reward": truth["reward"],
        "true_grad_norm": float(np.linalg.norm(truth["kl_grad"])),
        "sampler_kl_by_staleness": {str(k): v for k, v in stale_kl.items()},
    }


def _pick(stats: Mapping[str, np.ndarray] | None, i: int, prefix: str = "") -> dict:
    if stats is None:
        return {}
    return {prefix + k: (bool(v[i]) if isinstance(v[i], (bool, np.bool_)) else float(v[i])) for k, v in stats.items()}


def _table(c, engine, table_cfgs, truth, on, off, mc_on, mc_off) -> list[dict]:
    b, names = c["samples"], [config_name(x) for x in engine.configs]
    ex_on = stats_from_moments(on, truth["kl_grad"], b) if on is not None else None
    ex_off = stats_from_moments(off, truth["kl_grad"], b) if off is not None else None
    tot = total_loss_stats(on, truth["kl_grad"], truth["reward_loss_grad"], c["beta"], b) if on is not None else None
    primary, primary_off = ex_on or mc_on, ex_off or mc_off
    k1 = names.index("k1-reward")
    rows = []
    for config in table_cfgs:
        i = names.index(config_name(config))
        info = describe(config)
        if ex_on is not None:
            unbiased, unbiased_off = (
                bool(ex_on["relative_bias"][i] < UNBIASED_TOL),
                bool(ex_off["relative_bias"][i] < UNBIASED_TOL),
            )
        else:
            unbiased, unbiased_off = bool(mc_on["unbiased"][i]), bool(mc_off["unbiased"][i])
        row = {
            "name": info.name,
            "measured_by": "exact" if ex_on is not None else "montecarlo",
            "unbiased": unbiased,
            "claimed_unbiased": info.unbiased,
            "relative_bias": float(primary["relative_bias"][i]),
            "variance": float(primary["variance"][i]),
            "mse": float(primary["mse"][i]),
            "cosine": float(primary["cosine"][i]),
            "relative_rmse": float(primary["relative_rmse"][i]),
            "variance_vs_k1_reward": float(primary["variance"][i] / max(primary["variance"][k1], 1e-300)),
            "verdict": _verdict(float(primary["relative_bias"][i]), float(primary["cosine"][i]), unbiased),
            "gradient": info.gradient,
            "note": PRESET_NOTES.get(info.name, ""),
            "samples": b,
            "staleness": c["staleness"],
            "off_policy_unbiased": unbiased_off,
            "claimed_unbiased_off_policy": info.unbiased_off_policy,
            "off_policy_relative_bias": float(primary_off["relative_bias"][i]),
            "off_policy_variance": float(primary_off["variance"][i]),
            "off_policy_cosine": float(primary_off["cosine"][i]),
            "off_policy_note": info.off_policy,
        }
        if ex_off is not None:
            row["off_policy_truncated_fraction"] = float(ex_off["truncated_fraction"][i])
        if tot is not None:
            row.update(total_relative_bias=float(tot["relative_bias"][i]), total_cosine=float(tot["cosine"][i]))
        row.update(_pick(mc_on, i, "mc_") if ex_on is not None else {})
        rows.append(row)
    return rows


def _offpolicy(c, engine, truth, off, mc_off) -> list[dict]:
    """The off-policy trade-off at the table's staleness: bias^2 and variance of each correction."""
    names = [config_name(x) for x in engine.configs]
    wanted = [config_name(x) for x in catalog.offpolicy_configs(c["truncations"])]
    stats = stats_from_moments(off, truth["kl_grad"], c["samples"]) if off is not None else mc_off
    g2 = float(np.sum(np.square(truth["kl_grad"])))
    rows = []
    for name in wanted:
        i = names.index(name)
        row = {"name": name, "staleness": c["staleness"], "samples": c["samples"], **_pick(stats, i)}
        row["relative_bias_sq"] = row["relative_bias"] ** 2
        row["relative_variance"] = row["variance"] / g2
        rows.append(row)
    return rows


def _rao_blackwell(records: list[dict]) -> list[dict]:
    """Variance of k1-reward-rtg and full-both-rtg relative to k1-reward, per length (exact rows)."""
    out = []
    rows = [r for r in records if r["figure"] == "vs_length"]
    for mode in ("exact", "montecarlo"):
        for t in sorted({r["length"] for r in rows if r["mode"] == mode}):
            here = {r["config"]: r for r in rows if r["mode"] == mode and r["length"] == t}
            base = here["k1-reward"]["variance"]
            for name in ("k1-reward", "k1-reward-rtg", "full-both-rtg"):
                var = here[name]["variance"]
                out.append(
                    {
                        "figure": "rao_blackwell",
                        "config": name,
                        "mode": mode,
                        "length": t,
                        "samples": here[name]["samples"],
                        "variance": var,
                        "variance_reduction": base / var if var > 0 else float("inf"),
                    }
                )
    return out
