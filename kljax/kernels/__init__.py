"""Backend-specific kernels behind `model.kernels` ("auto" | "plain" | "cpu"; auto is cpu only on a
CPU backend). Each replaces one plain-JAX function one for one and has a test that they agree."""
