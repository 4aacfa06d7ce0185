"""Estimator comparison on a real model: SmolLM2-135M-Instruct (embedded, no download) on generated
arithmetic, RLOO, on-policy, one beta, one seed; the paper's four configurations plus no KL:

    none | k1 in reward (unbiased, the paper's recommendation) | k3 in loss (GRPO / verl low_var_kl)
    | k1 in loss (regularizes nothing in expectation) | k3 in reward (the paper saw it collapse)

In-domain: 2-digit addition/subtraction (`arithmetic:test`); out-of-domain: 3-digit operands
(`ood_digits`) and multiplication/exact division (`ood_ops`), all evaluated greedily before and after
(eval_examples each). For mean@k / pass@k on any checkpoint afterwards:
    kljax eval --checkpoint SWEEP_DIR/runs/k1-reward_b0.05_onpolicy_s0 --k 4

    kljax sweep --config configs/experiment_smollm2.py --out runs/smollm2 && kljax report runs/smollm2

Cost: configs/default.py states about 10 minutes for 20 steps of this model and batch on 2 CPU cores;
at 100 steps that is roughly 50 minutes per run, about 4-5 hours for the 5 runs on such a CPU (not
measured here in full: a job for one accelerator, where it takes minutes). Fewer steps for a smoke
test: `--config.steps=10`. More seeds: edit `seed` below.
"""


def get_config():
    return dict(
        base_config="default.py",
        base_overrides=[
            "steps=100",
            "checkpoint_every=10",
            "eval_examples=128",
            "task.name='arithmetic'",
            "task.eval_splits='test,ood_digits,ood_ops'",
            "optim.learning_rate=2e-6",
        ],
        kl=["none", "k1-reward", "k3-loss", "k1-loss", "k3-reward"],
        beta=[0.05],
        seed=[0],
        variants={"onpolicy": []},
    )
