"""Parallelism: the device mesh (`data`, `fsdp`, `tensor`) and its logical-axis table (`sharding.py`),
and multi-host runs on JAX's multi-controller runtime, one process per host (`distributed.py`)."""
