"""The RL trainer: train state, the jitted step, rollout, the loop, off-policy sampling."""
