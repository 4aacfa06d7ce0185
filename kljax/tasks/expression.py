"""A tiny, safe parser and evaluator for countdown expressions.

Grammar (integers, four operations, parentheses; no unary operators):
    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INTEGER | '(' expr ')'

Model output is parsed here and never passed to eval/exec. Anything else is an `ExpressionError`
(a ValueError) with the reason: names and function calls, attribute access and decimal points,
exponentiation (`**`, `^`), unary signs, unknown characters, expressions longer than `MAX_CHARS`,
more than `MAX_TOKENS` tokens, parentheses nested deeper than `MAX_DEPTH`, integers longer than
`MAX_NUMBER_DIGITS` digits, and division by zero. Values are exact (`fractions.Fraction`), so
`(6 / 4) * 2 == 3` holds and no float rounding can fake a target. Common notation is normalized
first: `×`, `·`, `\\times`, `\\cdot` -> `*`; `÷`, `\\div` -> `/`; the minus sign `−` -> `-`;
`\\left(`/`\\right)` -> parentheses; surrounding `$` are dropped.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from fractions import Fraction

MAX_CHARS = 300
MAX_TOKENS = 100
MAX_DEPTH = 12
MAX_NUMBER_DIGITS = 6

_REPLACEMENTS = (
    ("\\left(", "("),
    ("\\right)", ")"),
    ("\\left[", "("),
    ("\\right]", ")"),
    ("\\times", "*"),
    ("\\cdot", "*"),
    ("\\div", "/"),
    ("×", "*"),
    ("·", "*"),
    ("∗", "*"),
    ("÷", "/"),
    ("−", "-"),
    ("–", "-"),
    ("[", "("),
    ("]", ")"),
)
_OPERATORS = "+-*/"


class ExpressionError(ValueError):
    """An expression that is not a valid countdown expression (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Num:
    """An integer literal."""

    value: int


@dataclasses.dataclass(frozen=True)
class BinOp:
    """`left op right` with op in + - * /."""

    op: str
    left: Num | BinOp
    right: Num | BinOp


Node = Num | BinOp


def normalize(text: str) -> str:
    """Map common math notation onto the grammar's characters (see the module docstring)."""
    text = text.strip()
    if len(text) > 4 * MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    return text.strip().strip("$").strip()


def tokenize(text: str) -> list[str]:
    """Tokens of a normalized expression: integer literals, operators and parentheses."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    tokens: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif "0" <= ch <= "9":
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j - i > MAX_NUMBER_DIGITS:
                raise ExpressionError(f"number {text[i:j][:20]}... has more than {MAX_NUMBER_DIGITS} digits")
            if j < len(text) and text[j] == ".":
                raise ExpressionError("decimal points are not allowed (integers only)")
            tokens.append(text[i:j])
            i = j
        elif (ch == "*" and text[i + 1 : i + 2] == "*") or ch == "^":
            raise ExpressionError("exponentiation is not allowed (only + - * /)")
        elif ch in _OPERATORS or ch in "()":
            tokens.append(ch)
            i += 1
        elif ch.isalpha() or ch == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            raise ExpressionError(f"names are not allowed: {text[i:j][:20]!r}")
        elif ch == ".":
            raise ExpressionError("attribute access and decimal points are not allowed")
        else:
            raise ExpressionError(f"unexpected character {ch!r}")
        if len(tokens) > MAX_TOKENS:
            raise ExpressionError(f"expression has more than {MAX_TOKENS} tokens")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return token

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            node = BinOp(op, node, self.factor())
        return node

    def factor(self) -> Node:
        token = self.take()
        if token == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            node = self.expr()
            if self.take() != ")":
                raise ExpressionError("expected ')'")
            self.depth -= 1
            return node
        if token.isdigit():
            return Num(int(token))
        if token in ("+", "-"):
            raise ExpressionError("unary signs are not allowed (write each given number as is)")
        raise ExpressionError(f"unexpected token {token!r}")


def parse(text: str) -> Node:
    """Parse an expression into a tree (raises ExpressionError; never evaluates anything)."""
    if not isinstance(text, str):
        raise ExpressionError(f"expression must be a string, got {type(text).__name__}")
    tokens = tokenize(normalize(text))
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    node = parser.expr()
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected token {tokens[parser.pos]!r} after a complete expression")
    return node


def evaluate(node: Node) -> Fraction:
    """The exact value of a parsed expression (raises ExpressionError on division by zero)."""
    if isinstance(node, Num):
        return Fraction(node.value)
    left, right = evaluate(node.left), evaluate(node.right)
    if node.op == "+":
        return left + right
    if node.op == "-":
        return left - right
    if node.op == "*":
        return left * right
    if right == 0:
        raise ExpressionError("division by zero")
    return left / right


def numbers_used(node: Node) -> list[int]:
    """The integer literals of an expression, left to right."""
    if isinstance(node, Num):
        return [node.value]
    return numbers_used(node.left) + numbers_used(node.right)


def to_string(node: Node) -> str:
    """A fully parenthesized rendering that `parse` reads back to the same tree."""
    if isinstance(node, Num):
        return str(node.value)
    return f"({to_string(node.left)} {node.op} {to_string(node.right)})"


def check_countdown_expression(text: str, numbers: list[int] | tuple[int, ...]) -> Fraction:
    """Parse `text`, check it uses only `numbers` and each at most as often as given, and evaluate it.

    Returns the exact value; raises ExpressionError when the expression is invalid or uses a number
    that is not given, or a given number more often than it appears in `numbers`.
    """
    node = parse(text)
    used = Counter(numbers_used(node))
    available = Counter(int(x) for x in numbers)
    for value, count in used.items():
        if value not in available:
            raise ExpressionError(f"number {value} is not one of the given numbers {sorted(available.elements())}")
        if count > available[value]:
            raise ExpressionError(f"number {value} used {count} times but given {available[value]} time(s)")
    return evaluate(node)
