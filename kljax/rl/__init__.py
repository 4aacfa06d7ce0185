"""The RL objective as pure math: the whole loss the trainer differentiates, and what its gradient is.
No model code lives here; policies plug in through `kljax.policies.protocol`."""
