"""The RL trainer: config, train state, the jitted step, rollout, the loop, off-policy sampling,
checkpoints with their checksums, metrics logs, and SFT of a reference model."""
