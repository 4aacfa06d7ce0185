"""XLA-CPU kernels: hand-written backwards and memory layouts that XLA CPU's matmul kernels need
(`model.kernels="cpu"`, the default on a CPU backend); docs/performance.md has their measurements."""
