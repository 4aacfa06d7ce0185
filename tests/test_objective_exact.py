"""What `kljax.verdicts.objective` says of a run's objective is what the real rollout + train step do.

Every batch (one group per prompt, variable-length responses with a stop token) is enumerated
exactly on a tabular policy and driven through `step.score`, the rollout's `assemble_batch` and
`step.train_step` (SGD lr 1, PPO clip 0.2), in float64 (`kljax.studies.bias.through_trainer`). For every
preset x aggregation x advantage, on-policy and with a stale sampler, with and without a task
reward, the expected update E[g] is checked against grad(-J):
  unbiased: ||E[g] - grad(-J)|| <= 1e-6 ||grad(-J)||;
  scaled:   E[g] = c grad(-J) to 1e-6, and c is the scale describe states;
  biased:   E[g] is not any multiple of grad(-J): the residual after the best rescale is > 1e-2.
Space A: 3 tokens (one stops), responses of 1-2 tokens, G = 2, one micro-batch, every aggregation
and advantage. Space B: 2 tokens, 1-3 tokens, G = 3, two micro-batches, every preset under the
default and the length-normalized aggregations with RLOO and Dr. GRPO.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kljax.rl.objective import AGGREGATIONS, DEFAULT_AGGREGATION
from kljax.studies.bias.through_trainer import Space, expected_update, true_gradient
from kljax.train.step import StepSettings
from kljax.verdicts.objective import RunObjective, describe_objective
from kljax.verdicts.presets import PRESETS

BETA = 0.5
ADVANTAGES = ("rloo", "grpo", "dr_grpo")
SPACE_A = (Space(vocab=3, response_len=2, group_size=2), 1)
SPACE_B = (Space(vocab=2, response_len=3, group_size=3), 2)


def _problem(space: Space, seed: int = 0):
    policy = space.policy
    k = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = policy.init_params(k[0], 0.7, jnp.float64)
    noise = lambda key: policy.init_params(key, 0.5, jnp.float64)
    ref = jax.tree.map(jnp.add, params, noise(k[1]))
    stale = jax.tree.map(jnp.add, params, noise(k[2]))
    rewards = jax.random.uniform(k[3], (space.num_prompts, space.responses()[0].shape[0]), jnp.float64)
    return params, ref, stale, rewards


def check(kl, aggregation: str, advantage: str, space: Space, micro: int) -> list[str]:
    """Every (sampler, reward) case of one configuration; returns the mismatches."""
    kl = kl.replace(beta=BETA)
    if kl.truncation is not None:  # a truncation the toy's sequence weights reach (10 never binds here)
        kl = kl.replace(truncation=1.1)
    params, ref, stale, rewards = _problem(space)
    settings = StepSettings(space.policy, kl, aggregation, clip_low=0.2, micro_batches=micro)
    failures = []
    for sampler, async_level in ((params, 0), (stale, 1)):
        for task_reward in (True, False):
            if kl.placement == "none" and not task_reward:
                continue  # nothing to optimize
            r = rewards if task_reward else jnp.zeros_like(rewards)
            run = RunObjective(kl, aggregation, advantage, space.group_size, 0.2, None, 1, async_level,
                               space.response_len, task_reward)
            info = describe_objective(run)
            got = np.asarray(expected_update(params, ref, sampler, r, space=space, settings=settings,
                                             advantage=advantage, beta=BETA))
            truth = np.asarray(true_gradient(space, params, ref, r, kl))
            c = float(got @ truth / (truth @ truth))
            residual = float(np.linalg.norm(got - c * truth) / max(np.linalg.norm(got), 1e-300))
            rel = float(np.linalg.norm(got - truth) / np.linalg.norm(truth))
            case = f"{info.name} reward={task_reward}: describe {info.verdict} {info.scale}, measured " \
                   f"rel {rel:.2e} scale {c:.6f} residual {residual:.2e}"
            if info.verdict == "unbiased":
                ok = rel <= 1e-6
            elif info.verdict == "scaled":
                ok = residual <= 1e-6 and info.scale is not None and abs(c - info.scale) <= 1e-6 * info.scale
            else:
                ok = residual > 1e-2 or c <= 0
            if not ok:
                failures.append(case)
    return failures


@pytest.mark.parametrize("preset", [p for p, _ in PRESETS], ids=lambda p: describe_objective(RunObjective(p)).kl.name)
def test_describe_matches_the_trainer_every_aggregation_and_advantage(preset):
    space, micro = SPACE_A
    with jax.enable_x64(True):
        failures = [f for agg in AGGREGATIONS for adv in ADVANTAGES for f in check(preset, agg, adv, space, micro)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("preset", [p for p, _ in PRESETS], ids=lambda p: describe_objective(RunObjective(p)).kl.name)
def test_describe_matches_the_trainer_groups_of_three_two_micro_batches(preset):
    space, micro = SPACE_B
    with jax.enable_x64(True):
        failures = [f for agg in (DEFAULT_AGGREGATION, "seq-mean-token-mean") for adv in ("rloo", "dr_grpo")
                    for f in check(preset, agg, adv, space, micro)]
    assert not failures, "\n".join(failures)


def test_default_objective_is_unbiased_up_to_its_normalizer():
    """The defaults of RLConfig / StepSettings / the base config give c grad J, c = (1/max_new_tokens)."""
    from kljax.config import RLConfig
    from kljax.rl.kl import KLConfig

    rl = RLConfig()
    info = describe_objective(RunObjective.from_rl(rl, KLConfig()))
    assert info.verdict == "scaled" and info.scale == pytest.approx(1 / rl.max_new_tokens)
    assert StepSettings(None, KLConfig()).loss_aggregation == rl.loss_aggregation == DEFAULT_AGGREGATION
