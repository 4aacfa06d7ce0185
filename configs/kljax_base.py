"""Shared defaults of every run config; each configs/NAME.py starts from `base()` and changes fields.

`kljax.train.config.load_config` puts this directory on sys.path, so configs `from kljax_base import base`.
"""

from __future__ import annotations

import ml_collections


def base() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.steps = 100
    c.checkpoint_every = 25
    # Each checkpoint holds the parameters and AdamW's two moments: 3x the float32 weights (SmolLM2-135M:
    # 1.4 GiB). Two are kept, so that a damaged newest one falls back to the one before.
    c.keep_checkpoints = 2
    c.max_nonfinite_steps = 5  # stop after this many consecutive steps with a non-finite loss or gradient
    c.eval_every = 0  # 0: evaluate only before and after the run
    c.eval_examples = 64  # problems per evaluation split
    c.eval_examples_ood = 0  # problems per out-of-domain split (named ood*); 0: eval_examples
    c.eval_samples = 4  # samples per problem at rl.temperature for the sampled accuracy (0: greedy only)
    c.model = ml_collections.ConfigDict(
        dict(
            # "tiny" (random init), "default" (SmolLM2-135M-Instruct), an HF checkpoint dir, or "tabular"
            # (one logit row per prefix; only with task toy_optimum, whose responses it enumerates)
            source="default",
            dtype="float32",
            param_dtype="float32",
            scan_layers=True,
            # "none", "full", "dots_saveable", "dots_no_batch_saveable". "full" recomputes each layer
            # in the backward pass; with rl.micro_batches > 1 it also adds the layers' gradients into
            # the accumulator in place (one gradient tree instead of two): the low-memory setting.
            remat="none",
            # "auto" (the XLA-CPU kernels on a CPU backend, plain JAX elsewhere), "plain" (jnp.einsum,
            # jax.nn.dot_product_attention, autodiff everywhere) or "cpu"; the same numbers either way.
            kernels="auto",
            # LoRA adapters (kljax/models/lora.py): rank 0 = full fine-tuning. With rank r, only the
            # adapters train (the base stays frozen, one copy, in the compute dtype when that is narrower than
            # param_dtype) and the reference is the base itself.
            lora=dict(rank=0, alpha=16.0, targets="q,k,v,o,gate,up,down"),
            # Used only by source="tiny":
            tiny=dict(vocab_size=19, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64, init_std=0.02),
            # Used only by source="tabular": pi_ref's logits ~ init_scale * N(0, 1)
            tabular=dict(init_scale=1.0),
        )
    )
    c.task = ml_collections.ConfigDict(
        # eval_splits "": the task's own (a data file's test/validation split; arithmetic's test,ood_digits,ood_ops).
        # prompt_format "auto": built-in tasks through the chat template; the user's data as TRL sends it
        # (standard prompts as written, conversational ones through the chat template); see kljax/tasks/prompting.py
        dict(name="arithmetic", split="train", eval_splits="", prompt_format="auto",
             answer_format="", data_dir="",  # answer_format: "boxed", "answer_line" or "" (the task's own)
             # File tasks (name jsonl, parquet, csv or hf; see kljax/tasks/files.py):
             path="", prompt_key="prompt", answer_key="", messages_key="", eval_fraction=0.1,
             prompt_template="", drop_overlong=False,
             system_prompt=None,  # None: kljax's default for built-in tasks, none for data files; "": none
             # Task toy_optimum (kljax/tasks/toy_optimum.py): one prompt per reward shape, responses of
             # response_len tokens over vocab ids (the last one the stop token)
             toy=dict(shapes="sparse,long,conflict", vocab=3, response_len=3))
    )
    # Rewards (kljax/train/reward_set.py): "" and "" = the task's own check.
    c.reward = ml_collections.ConfigDict(
        dict(functions="", weights=None, on_error="raise", timeout_s=None, model="", model_weight=1.0,
             model_max_len=0)
    )
    # Trackers beside metrics.jsonl (kljax/train/tracking.py): a comma list of tensorboard, wandb, mlflow
    # (the last two: pip install 'kljax[track]'), or "none"; project: the W&B project / MLflow experiment
    c.logging = ml_collections.ConfigDict(dict(report_to="tensorboard", project="kljax", run_name=""))
    c.log_samples_every = 0  # write a few prompts/completions to samples.jsonl every this many steps
    c.log_samples_n = 4
    c.kl = ml_collections.ConfigDict(
        dict(estimator="k1", placement="reward", credit="sequence", scope="token", off_policy="none",
             truncation=None, beta=0.05, target_kl=None, adapt_horizon=10000.0,
             in_baseline=True)  # False: the reward-placed KL after the group baseline/scale (OpenRLHF)
    )
    c.rl = ml_collections.ConfigDict(
        dict(advantage="rloo", group_size=4, prompts_per_step=8, max_prompt_len=64, max_new_tokens=32,
             temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
             stop=[],  # strings or token ids that end a response like EOS, e.g. ["</answer>"]
             loss_aggregation="seq-mean-token-sum-norm", clip_low=0.2,
             clip_high=None, updates_per_batch=1, async_level=0, micro_batches=1,
             # on-policy in float32, take log pi of the sampled tokens from the sampler instead of a
             # second forward pass (16-bit compute always re-scores: rounding differs)
             reuse_sampler_logprobs=True,
             clip_ratio_c=None,  # dual-clip PPO (verl): > 1, or None
             advantage_std_eps=1e-4)  # grpo: group std + this (TRL's 1e-4; verl 1e-6)
    )
    c.optim = ml_collections.ConfigDict(
        dict(learning_rate=1e-6, schedule="constant", warmup_steps=0, end_lr_fraction=0.0, weight_decay=0.0,
             b1=0.9, b2=0.999, eps=1e-8, max_grad_norm=1.0)
    )
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1))
    return c
