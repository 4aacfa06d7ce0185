"""The jitted sampler and its parts; `kljax.sampling.generate(...)` and the rest of the sampler's API
are re-exported here from the modules that define them.

    sampler.py   prompts -> bucketed batch, one prefill, the `lax.while_loop` decode: `generate`
    step.py      the model calls: prefill (the model's own forward) and the decode step over the KV cache
    logits.py    one step's logits -> a token: `SamplingParams`, the repetition penalty, the draw, its
                 log-prob and entropy
    stops.py     stop strings and ids (`rl.stop`) -> the sampler's stop ids and id sequences
"""

from kljax.sampling.logits import (
    SamplingParams,
    penalize_repeats,
    sample_logits,
    sampling_entropy,
    sampling_logprobs,
)
from kljax.sampling.sampler import (
    DEFAULT_PROMPT_BUCKETS,
    DecodeState,
    SampleResult,
    bucket_length,
    compile_count,
    generate,
    greedy_continuations,
    left_pad,
    prepare_prompts,
    response_logprobs,
)
from kljax.sampling.stops import Stops, resolve_stops

__all__ = [
    "DEFAULT_PROMPT_BUCKETS",
    "DecodeState",
    "SampleResult",
    "SamplingParams",
    "Stops",
    "bucket_length",
    "compile_count",
    "generate",
    "greedy_continuations",
    "left_pad",
    "penalize_repeats",
    "prepare_prompts",
    "resolve_stops",
    "response_logprobs",
    "sample_logits",
    "sampling_entropy",
    "sampling_logprobs",
]
