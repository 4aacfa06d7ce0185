"""A smoke sweep on the tiny config: 3 KL configurations (k1 in reward, k3 in loss, the Rao-Blackwellized
full-both-rtg) + no KL, one beta, one seed, 2 steps per run.

    kljax sweep --config configs/sweep_tiny.py --out runs/sweep_tiny && kljax report runs/sweep_tiny
"""


def get_config():
    return dict(
        base_config="tiny.py",
        base_overrides=["steps=2", "checkpoint_every=1", "eval_examples=8"],
        kl=["none", "k1-reward", "k3-loss", "full-both-rtg"],
        beta=[0.05],
        seed=[0],
        variants={"onpolicy": []},
    )
