"""Regular expressions for the JSON Schema (`madsl schema`): topology strings and budget values.

Editors check a `pattern` as an ECMA-262 regular expression, jsonschema as a Python one, so
these use only what both read alike (no `\\-` or `\\#` escapes, which ECMA's unicode mode
refuses). They are built from the sources of the syntax, never copied from them: the topology
pattern from the grammar's terminals (grammar/topology.lark) and a list of symbols (the
stdlib's), the budget pattern from madsl.lang.budget's number and suffixes.

A regular expression cannot count parentheses, so the topology pattern checks every token and
what may follow it, not that groups close; `madsl check` reads the whole string. Whatever these
patterns reject, the loader rejects too (tests/test_schema.py checks both against the parsers).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from madsl.lang import budget  # its _NUMBER and _SUFFIX: the budget grammar's own, not a copy
from madsl.lang.topology import NO_CHANNEL

_ECMA_SPECIAL = set("^$\\.*+?()[]{}|/")
_SYMBOL_CONTINUES = "(?![A-Za-z0-9_])"  # a symbol ends where the grammar's SYMBOL cannot go on


def literal(text: str) -> str:
    """`text` as a regular expression that ECMA-262 (unicode mode) and Python read alike."""
    return "".join("\\" + c if c in _ECMA_SPECIAL else c for c in text)


@cache
def _terminals() -> dict[str, str]:
    """The grammar's terminals by name: a regular expression for each named one (SYMBOL,
    COUNT, ...), the escaped literal for each punctuation mark (COLON, LPAR, ...)."""
    import lark
    from lark.lexer import PatternStr

    from madsl.resources import grammar_file

    out = {}
    for terminal in lark.Lark(grammar_file().read_text(encoding="utf-8"), parser="lalr").terminals:
        pattern = terminal.pattern
        out[terminal.name] = literal(pattern.value) if isinstance(pattern, PatternStr) else pattern.to_regexp()
    return out


def topology_pattern(symbols: Iterable[str] | None = None) -> str:
    """A pattern for topology strings: the grammar's tokens in an order it allows, with layer
    symbols from `symbols` (longest first) or, with None, any name the grammar takes."""
    t = _terminals()
    ws = t["WS"][:-1] + "*" if t["WS"].endswith("+") else f"(?:{t['WS']})?"  # optional whitespace
    if symbols is None:
        mixer_symbol = channel_symbol = f"(?:{t['SYMBOL']})"
    else:
        names = sorted(set(symbols) - {NO_CHANNEL}, key=lambda s: (-len(s), s))
        mixer_symbol = f"(?:{'|'.join(map(literal, names))}){_SYMBOL_CONTINUES}"
        channel_symbol = f"(?:{'|'.join(map(literal, [*names, NO_CHANNEL]))}){_SYMBOL_CONTINUES}"
    value = f"(?:{t['NUMBER']}|{t['NAME']}|{t['STRING']})"
    setting = f"{t['NAME']}{ws}{t['EQUAL']}{ws}{value}{ws}"
    attrs = f"(?:{t['LBRACE']}{ws}(?:{setting}(?:{t['COMMA']}{ws}{setting})*)?{t['RBRACE']}{ws})"
    tail = f"(?:{t['HASH']}{ws}{t['TAG']}{ws})?{attrs}?"  # a tag, then per-occurrence settings

    def layer(symbol: str) -> str:
        return f"{symbol}{ws}{tail}"

    parallel = f"{t['LSQB']}{ws}{layer(mixer_symbol)}(?:{t['VBAR']}{ws}{layer(mixer_symbol)})+{t['RSQB']}{ws}"
    inject = f"(?:{layer(mixer_symbol)}{t['MORETHAN']}{ws})?"  # an injector before its mixer: Zs#a>M2
    block = f"{inject}(?:{layer(mixer_symbol)}|{parallel})(?:{t['MINUS']}{ws}{layer(channel_symbol)})?"
    count = f"(?:{t['COUNT']}{ws})?"
    opens = f"(?:{count}{t['LPAR']}{ws})*"  # groups that start here: 2(H:A) ...
    closes = f"(?:{t['RPAR']}{ws}{attrs}?(?:{t['REPEAT']}{ws}{t['COUNT']}{ws})?)*"  # ... and end: ){..}x2
    item = f"{opens}{count}{block}{closes}"
    # items, each followed by a separator and more, or by the end (written once: a shorter pattern)
    return f"^{ws}(?:{item}(?:(?:{t['COLON']}|{t['VBAR']}){ws}(?!$)|$))+$"


def budget_patterns() -> tuple[str, str]:
    """Patterns for a budget written as a string: (any bound, one quantity). A bound is a
    quantity (4096, 500k, 1.2M), with a tolerance (500k ± 10%, 1.2M +- 50k) or one-sided
    (<= 5M, >= 1M); a quantity is a number with one of the suffixes madsl/lang/budget.py reads."""
    ws = r"\s*"
    suffix = "[" + "".join(sorted(s for s in budget._SUFFIX if s)) + "]"  # k, M, G, ...
    quantity = f"{budget._NUMBER}{ws}{suffix}?"
    plus_minus = "|".join(literal(op) for op in ("±", "+/-", "+-"))
    tolerance = f"(?:{plus_minus}){ws}{budget._NUMBER}{ws}(?:%|{suffix})?"
    one_sided = "(?:<=|>=)"  # budgets are inclusive: < and > are refused
    bound = f"^{ws}(?:{one_sided}{ws}{quantity}|{quantity}(?:{ws}{tolerance})?){ws}$"
    return bound, f"^{ws}{quantity}{ws}$"
