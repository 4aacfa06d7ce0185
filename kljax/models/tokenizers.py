"""A character-level tokenizer for tiny configs and tests (no download, no chat template).

Ids: 0 = padding, 1 = end of sequence, then one id per character of the alphabet. Characters
outside the alphabet are an error when encoding (a tiny config's task must fit its alphabet).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ALPHABET = "0123456789 ?+-*=:"


class _SymbolIds:
    """Encoding by a table of one id per character (`_ids`), and the vocabulary size."""

    _ids: dict[str, int]
    vocab_size: int

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        bad = sorted({ch for ch in text if ch not in self._ids})
        if bad:
            raise ValueError(f"characters {bad} are not in the tokenizer's symbols {''.join(self._ids)!r}")
        return [self._ids[ch] for ch in text]


class CharTokenizer(_SymbolIds):
    """Duck-types the parts of a Hugging Face tokenizer kljax uses: encode, decode, eos/pad ids."""

    pad_token_id = 0
    eos_token_id = 1
    chat_template = None

    def __init__(self, alphabet: str = DEFAULT_ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
        self.alphabet = alphabet
        self._ids = {ch: i + 2 for i, ch in enumerate(alphabet)}
        self.vocab_size = len(alphabet) + 2

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i in (self.pad_token_id, self.eos_token_id):
                if skip_special_tokens:
                    continue
                out.append("<pad>" if i == self.pad_token_id else "<eos>")
            elif 2 <= i < self.vocab_size:
                out.append(self.alphabet[i - 2])
            else:
                raise ValueError(f"token id {i} is outside this tokenizer's vocabulary of {self.vocab_size}")
        return "".join(out)


class SymbolTokenizer(_SymbolIds):
    """One symbol per id, no special ids: id i is `symbols[i]` (toy tasks whose token ids are the
    responses themselves, `kljax.tasks.toy_optimum`). `eos_token_id` is the stop token's id; it
    decodes to its symbol like any other (the stop is part of a toy response)."""

    chat_template = None

    def __init__(self, symbols: str, eos_token_id: int, pad_token_id: int = 0) -> None:
        if len(set(symbols)) != len(symbols) or not symbols:
            raise ValueError(f"symbols must be non-empty and distinct, got {symbols!r}")
        for name, i in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
            if not 0 <= i < len(symbols):
                raise ValueError(f"{name}={i} is outside the {len(symbols)} symbols {symbols!r}")
        self.symbols = symbols
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self._ids = {ch: i for i, ch in enumerate(symbols)}
        self.vocab_size = len(symbols)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        bad = [int(i) for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad} are outside this tokenizer's {self.vocab_size} symbols")
        return "".join(self.symbols[int(i)] for i in ids)
