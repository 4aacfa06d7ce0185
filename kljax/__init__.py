"""kljax: KL-regularized RL fine-tuning of LLMs in JAX, and exact studies of KL-estimator gradients."""

__version__ = "0.1.0"
