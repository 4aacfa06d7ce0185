"""Studies built on the trainer: gradient bias of each configuration (`bias/`), convergence to the exact
optimum of toy tasks, evaluation, sweeps and their reports, per-device memory plans."""
