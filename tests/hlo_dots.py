"""The element types of every dot's two operands in a compiled HLO text, fused or not: how the
tests see whether XLA CPU kept a 16-bit dot 16-bit (it converts both operands of a dot it runs
as a float32 dot)."""

import re


def dot_operand_types(hlo: str) -> list[tuple[str, str]]:
    """[(lhs type, rhs type)] of each `dot(...)` in `hlo` (e.g. ("bf16", "bf16"))."""
    types = {}
    for m in re.finditer(r"%([\w.\-]+) = (\w+)\[[\d,]*\]", hlo):
        types.setdefault(m.group(1), m.group(2))
    dots = re.findall(r"= \w+\[[\d,]*\]\{[\d,]*\} dot\(%([\w.\-]+), %([\w.\-]+)\)", hlo)
    return [(types[lhs], types[rhs]) for lhs, rhs in dots]
