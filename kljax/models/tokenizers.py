"""A character-level tokenizer for tiny configs and tests (no download, no chat template).

Ids: 0 = padding, 1 = end of sequence, then one id per character of the alphabet. Characters
outside the alphabet are an error when encoding (a tiny config's task must fit its alphabet).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ALPHABET = "0123456789 ?+-*=:"


class CharTokenizer:
    """Duck-types the parts of a Hugging Face tokenizer kljax uses: encode, decode, eos/pad ids."""

    pad_token_id = 0
    eos_token_id = 1
    chat_template = None

    def __init__(self, alphabet: str = DEFAULT_ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet) or not alphabet:
            raise ValueError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
        self.alphabet = alphabet
        self._ids = {ch: i + 2 for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 2

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        bad = sorted({ch for ch in text if ch not in self._ids})
        if bad:
            raise ValueError(f"characters {bad} are not in the tokenizer's alphabet {self.alphabet!r}")
        return [self._ids[ch] for ch in text]

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
