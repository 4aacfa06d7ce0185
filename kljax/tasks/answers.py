"""Final-answer extraction from model completions, and answer normalization.

`extract_final_answer(text)` looks, in this order, for:
  1. the last complete `\\boxed{...}` (or `\\fbox{...}`), braces nested to any depth; a boxed answer
     that is itself one `\\boxed{...}` is unwrapped; `\\boxed 5` (no braces) takes the next token;
  2. the last "Answer: ..." (any case, also "Final answer:"), up to the end of its line;
  3. the last "#### ..." (GSM8K's marker), up to the end of its line;
  4. the last number in the text (e.g. "-1,234.5"; commas between digit groups allowed).
It returns the answer text stripped of surrounding spaces, `$` signs and a trailing period, or None.

All functions here run in time linear in the input (regular expressions without nested
quantifiers, one pass over braces) and never raise on any string: they are the fast in-process path.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_INT_DIGITS = 1000  # longer integers are treated as unparseable (int() itself refuses > 4300 digits)

_BOXED_OR_BRACE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s$]+)")
_ANSWER_LINE = re.compile(r"answer(?:\s+is)?\s*[:：]([^\n]*)", re.IGNORECASE)
_HASHES = re.compile(r"####([^\n]*)")
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_LATEX_SPACING = re.compile(r"\\[,;:! ]|\\q?quad|~")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf)\{([^{}]*)\}")
_CHOICE = re.compile(r"^\(?([A-Za-z])\)?(?:[.:)\s]|$)")
_ANSWER_IS_CHOICE = re.compile(r"answer\s+is(?:\s*:)?\s*\(?([A-J])\)?(?![A-Za-z])", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`/`\\fbox{...}` (the one that closes last), or None.
    A content that is itself exactly one boxed group is unwrapped, to any depth, in one pass."""
    stack: list[int | None] = []  # content start of an open boxed brace, None for a plain brace
    content_at: dict[int, int] = {}  # where a boxed token starts -> where its content starts
    close_of: dict[int, int] = {}  # content start of a closed boxed group -> its closing brace
    best: tuple[int, int] | None = None
    for match in _BOXED_OR_BRACE.finditer(text):
        token = match.group()
        if token == "}":
            if stack:
                start = stack.pop()
                if start is not None:
                    best = (start, match.start())
                    close_of[start] = match.start()
        elif token == "{":
            stack.append(None)
        else:
            stack.append(match.end())
            content_at[match.start()] = match.end()
    if best is None:
        bare = _last_match(_BOXED_BARE, text)
        return bare.group(1) if bare is not None else None
    begin, end = best
    while True:
        while begin < end and text[begin].isspace():
            begin += 1
        while end > begin and text[end - 1].isspace():
            end -= 1
        inner = content_at.get(begin)
        if inner is None or close_of.get(inner) != end - 1:
            return text[begin:end]
        begin, end = inner, end - 1


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - keep the last match
        pass
    return found


def _last_group(pattern: re.Pattern[str], text: str) -> str | None:
    found = _last_match(pattern, text)
    return found.group(1) if found is not None else None


def clean_answer(answer: str) -> str:
    """Strip spaces, surrounding `$`, a trailing period and `\\text{}`-style wrappers."""
    answer = _TEXT_WRAPPER.sub(r"\1", answer.strip())
    return answer.lstrip("$ \t\r\n").rstrip("$. \t\r\n")


def extract_final_answer(text: str) -> str | None:
    """The final answer of a completion (see the module docstring for the order), or None."""
    if not isinstance(text, str):
        return None
    for found in (last_boxed(text), _last_group(_ANSWER_LINE, text), _last_group(_HASHES, text)):
        if found is not None and clean_answer(found):
            return clean_answer(found)
    number = _last_match(_NUMBER, text)
    return number.group() if number is not None else None


def has_answer_marker(text: str) -> bool:
    """Whether `text` states a final answer explicitly (boxed, "Answer:" or "####")."""
    return any(f is not None for f in (last_boxed(text), _last_group(_ANSWER_LINE, text), _last_group(_HASHES, text)))


def parse_number(answer: str | None) -> Fraction | None:
    """A number written as an integer, decimal or simple fraction (`-3`, `1,234`, `2.50`, `3/4`,
    `\\frac{3}{4}`, `\\$5`, `18 dollars`), or None. Exact: returns a Fraction."""
    if answer is None:
        return None
    s = clean_answer(answer)
    s = _LATEX_SPACING.sub("", s).replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("{,}", "").replace(" ", "")
    if "=" in s:  # "x = 18", "47 + 38 = 85": the value after the last "="
        s = s.rsplit("=", 1)[1]
    if "frac" in s:
        match = re.fullmatch(r"(-?)\\[dt]?frac\{(-?\d{1,50})\}\{(\d{1,50})\}", s)
        if match is None:
            return None
        sign, num, den = match.groups()
        if int(den) == 0:
            return None
        return Fraction(int(num), int(den)) * (-1 if sign else 1)
    if re.fullmatch(r"-?\d{1,50}/\d{1,50}", s):
        num, den = s.split("/")
        return None if int(den) == 0 else Fraction(int(num), int(den))
    match = re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+", s)
    if match is None:
        # "18 dollars", "x = 18": one number and nothing numeric else
        numbers = _NUMBER.findall(s)
        if len(numbers) != 1 or re.search(r"[=<>^_/*+]", s.replace(numbers[0], "", 1)):
            return None
        s = numbers[0]
    s = s.replace(",", "")
    if len(s) > MAX_INT_DIGITS + 3:
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def parse_integer(answer: str | None) -> int | None:
    """An integer answer (`18`, `-3`, `1,234`, `18.00`, `\\$18`), or None (including for `18.5`)."""
    value = parse_number(answer)
    if value is None or value.denominator != 1:
        return None
    return int(value)


def integers_equal(predicted: str | None, target: str) -> bool:
    """Exact integer match of a predicted answer against an integer target."""
    got, want = parse_integer(predicted), parse_integer(target)
    return got is not None and want is not None and got == want


def extract_choice(text: str, choices: list[str] | tuple[str, ...] = ()) -> int | None:
    """The index of the chosen option (A=0, B=1, ...) in a multiple-choice completion, or None.

    Reads the final answer (see `extract_final_answer`, without the last-number fallback) or the last
    "the answer is (X)"; accepts "B", "(B)", "B.", "B) text", and the exact text of a choice.
    """
    if not isinstance(text, str):
        return None
    candidates = [last_boxed(text), _last_group(_ANSWER_LINE, text), _last_group(_ANSWER_IS_CHOICE, text)]
    n = len(choices) if choices else 26
    for found in candidates:
        if found is None:
            continue
        answer = clean_answer(found)
        match = _CHOICE.match(answer)
        if match is not None:
            index = ord(match.group(1).upper()) - ord("A")
            if 0 <= index < n:
                return index
        lowered = answer.lower()
        for index, choice in enumerate(choices):
            if lowered and lowered == choice.strip().lower().rstrip("."):
                return index
    return None
