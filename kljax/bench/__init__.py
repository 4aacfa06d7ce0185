"""Benchmarks of kljax against the tools users would pick instead (`kljax bench ...`).

One module per benchmark (`decode.py`: the sampler vs transformers' `generate`), each with
`configure(parser)` and `run(args) -> int`, listed in `kljax.bench.cli.BENCHMARKS`.
"""
