"""Benchmarks of kljax against the tools users would pick instead (`kljax bench ...`).

One module per benchmark, each with `configure(parser)` and `run(args) -> int`, listed in
`benchmarks.cli.BENCHMARKS`: `decode.py` (the sampler vs transformers' `generate`), `train.py`
(one policy update vs transformers + torch AdamW; its peer in `train_peer.py`), `kl.py` (KL
estimators and losses vs PyTorch eager; cases in `kl_cases.py`, PyTorch formulas in
`torch_losses.py`), `rl.py` (a whole RL iteration vs TRL). Shared pieces (timing statistics,
matmul peak, model loading incl. `random:NAME`, JSON) are in `common.py`.
"""
