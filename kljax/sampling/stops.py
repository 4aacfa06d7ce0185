"""A run's stops (`rl.stop`: strings or token ids) as the sampler's stop token ids and stop sequences.

    stops = resolve_stops(["\\n\\n", "</answer>", 2], tokenizer, vocab_size)
    SamplingParams(..., stop_token_ids=eos + stops.token_ids, stop_sequences=stops.sequences)

An id stops the response like EOS. A string stops it at the token that completes it, found on
the device inside the decode loop: every token whose text contains the string is a stop token, and
every way of spelling the string with whole tokens of the vocabulary (at most `MAX_SPELLINGS`, the
fewest tokens first, the tokenizer's own encoding always included) is a stop sequence. A string
that the response's tokens spell only across a token that begins before it (e.g. "x\\n" then "\\n"
for "\\n\\n") is not caught. The stop is kept at the end of the response (as EOS is), so the
completion text passed to reward functions ends with it; every token after it is masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kljax.config.rl import check_stop_values

MAX_SPELLINGS = 32

_VOCAB_TEXTS: dict[tuple[int, int], list[str]] = {}  # (id(tokenizer), vocab size) -> text of each id
_RESOLVED: dict[tuple[int, tuple[Any, ...], int], Stops] = {}


@dataclasses.dataclass(frozen=True)
class Stops:
    """token_ids: ids that end a response; sequences: id sequences (2+ ids) that end it."""

    token_ids: tuple[int, ...] = ()
    sequences: tuple[tuple[int, ...], ...] = ()


def _vocab_texts(tokenizer: Any, vocab_size: int) -> list[str]:
    key = (id(tokenizer), vocab_size)
    if key not in _VOCAB_TEXTS:
        n = min(vocab_size, len(tokenizer)) if hasattr(tokenizer, "__len__") else vocab_size
        ids = [[i] for i in range(n)]
        if hasattr(tokenizer, "batch_decode"):
            texts = list(tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))
        else:
            texts = []
            for i in ids:
                try:
                    texts.append(tokenizer.decode(i, skip_special_tokens=True))
                except (ValueError, KeyError):
                    texts.append("")
        _VOCAB_TEXTS[key] = texts
    return _VOCAB_TEXTS[key]


def _spellings(text: str, ids_of: dict[str, list[int]], limit: int) -> list[tuple[int, ...]]:
    """Up to `limit` ways of writing `text` as whole tokens (fewest tokens first)."""
    n = len(text)
    fewest = [0] * n + [0]  # fewest tokens spelling text[i:], or None when it cannot be spelled
    for i in range(n - 1, -1, -1):
        options = [1 + fewest[j] for j in range(i + 1, n + 1) if text[i:j] in ids_of and fewest[j] is not None]
        fewest[i] = min(options) if options else None
    if fewest[0] is None:
        return []
    found: list[tuple[int, ...]] = []

    def walk(i: int, prefix: tuple[int, ...], budget: int) -> None:
        if len(found) >= limit:
            return
        if i == n:
            found.append(prefix)
            return
        for j in range(i + 1, n + 1):
            piece = text[i:j]
            if piece in ids_of and fewest[j] is not None and len(prefix) + 1 + fewest[j] <= budget:
                for token in ids_of[piece]:
                    walk(j, (*prefix, token), budget)

    for budget in range(fewest[0], n + 1):  # by increasing number of tokens
        before = len(found)
        walk(0, (), budget)
        found = found[:before] + [s for s in found[before:] if len(s) == budget]
        if len(found) >= limit:
            break
    return found[:limit]


def resolve_stops(stop: Sequence[str | int], tokenizer: Any, vocab_size: int) -> Stops:
    """The sampler's stops for `rl.stop` (see the module docstring); an id beyond `vocab_size` or a
    string that no tokens can write is a ValueError naming it. Cached per tokenizer and stops."""
    values = check_stop_values(stop)
    key = (id(tokenizer), values, vocab_size)
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve(values, tokenizer, vocab_size)
    return _RESOLVED[key]


def _resolve(values: tuple[str | int, ...], tokenizer: Any, vocab_size: int) -> Stops:
    ids: set[int] = set()
    sequences: set[tuple[int, ...]] = set()
    for v in values:
        if isinstance(v, int):
            if v >= vocab_size:
                raise ValueError(f"rl.stop: token id {v} is beyond the vocabulary of {vocab_size}")
            ids.add(v)
            continue
        texts = _vocab_texts(tokenizer, vocab_size)
        containing = {i for i, t in enumerate(texts) if v in t}
        ids_of: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            if t and t in v:
                ids_of.setdefault(t, []).append(i)
        spelled = _spellings(v, ids_of, MAX_SPELLINGS)
        try:
            own = tuple(int(t) for t in tokenizer.encode(v, add_special_tokens=False))
        except (ValueError, KeyError):
            own = ()
        if own and all(t < vocab_size for t in own):
            spelled.append(own)
        if not containing and not spelled:
            raise ValueError(f"rl.stop: the tokenizer cannot write {v!r} (no token or token sequence spells it)")
        ids |= containing
        sequences |= {s for s in spelled if len(s) > 1}
        ids |= {s[0] for s in spelled if len(s) == 1}
    return Stops(tuple(sorted(ids)), tuple(sorted(sequences)))
