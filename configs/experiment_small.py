"""The estimator comparison at laptop scale: every KL configuration of the table on a tiny transformer
that was first taught 2-digit arithmetic by supervised fine-tuning (SFT), which is then also the frozen
reference model pi_ref of the KL term.

1. SFT warm start (`kljax.train.sft`, once per sweep directory, in SWEEP_DIR/sft): a 2-layer Llama-style
   model (hidden 96) over a character tokenizer, SFT_STEPS steps of cross-entropy on the correct
   answers of `arithmetic:train` (raw prompts "What is 47 + 18?", target "65<eos>").
2. RL from it (RLOO, group 4, 8 prompts per step, temperature 1) with each KL configuration:
     none; k1 and k3 in reward; k1, k2 and k3 in loss; k3 in both; k2 sequence-level in loss;
     the full-vocabulary KL in loss and Rao-Blackwellized (full-both-rtg)
   at beta in {0.1, 1} (none runs once), on-policy and with rl.async_level=4 (the sampler uses
   the parameters of 4 steps earlier, uncorrected), 3 seeds: (9 x 2 + 1) x 2 x 3 = 114 runs.
3. Greedy evaluation before/after on arithmetic:test (in-domain), ood_digits and ood_ops (OOD; the
   tiny model cannot solve these, so they measure whether RL damages anything beyond the task).

    kljax sweep --config configs/experiment_small.py --out runs/small      # in-process, one run at a time
    kljax report runs/small

Cost, measured on 2 CPU cores shared with other jobs (load average 5-10), STEPS = 400:
  * SFT warm start: 1500 steps in 342 s (800 steps gave only 10% greedy test accuracy; 1500 give 65%).
  * one RL run, in-process (sequential sweep): 20-28 s wall for 300 steps incl. start-up, compilation
    (about 20 s more for the very first run; the XLA cache serves the rest) and the before/after
    evaluation of 3 x 128 prompts, i.e. about 27-37 s for 400 steps;
  * with --parallel 2: 53-88 s wall per run, 2 at a time: 8 runs in 284 s = 35.5 s per run.
Estimate for the whole grid: 342 s + 114 x 30-36 s = about 60-75 minutes (the full-vocabulary runs,
measured before they were supported, add a reference forward per update: assume them 1.5x as long);
under 2 hours unless the machine is twice as busy. On 2 cores --parallel 2 gains nothing (each
subprocess also pays ~10 s of start-up); use it on machines with more cores.
"""

SFT_STEPS = 1500
STEPS = 400


def get_config():
    return dict(
        base_config="tiny.py",
        base_overrides=[
            f"steps={STEPS}",
            "checkpoint_every=100",
            "keep_checkpoints=1",
            "eval_examples=128",
            "task.name='arithmetic'",
            "task.split='train'",
            "task.eval_splits='test,ood_digits,ood_ops'",
            "task.prompt_format='raw'",
            "rl.group_size=4",
            "rl.prompts_per_step=8",
            "rl.max_prompt_len=24",
            "rl.max_new_tokens=6",
            "optim.learning_rate=1e-4",
        ],
        kl=["none", "k1-reward", "k3-reward", "k1-loss", "k2-loss", "k3-loss", "k3-both", "k2-loss-seq",
            "full-both-rtg", "full-loss"],
        beta=[0.1, 1.0],
        seed=[0, 1, 2],
        variants={"onpolicy": [], "async4": ["rl.async_level=4"]},
        sft=dict(task="arithmetic", split="train", eval_splits="test,ood_digits,ood_ops", hidden_size=96,
                 intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24, steps=SFT_STEPS,
                 batch_size=64, learning_rate=3e-3, warmup_steps=30, max_prompt_len=24, max_answer_len=5,
                 eval_examples=128, seed=0),
    )
