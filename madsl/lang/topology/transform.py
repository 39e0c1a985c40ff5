"""The topology language's Lark transformer: the parse tree of grammar/topology.lark -> the plain
data of nodes.py, checking on the way what the grammar cannot (counts and numbers within
the limits, group attributes and their values, a setting written twice, control characters in a
quoted value). `parse` (parse.py) runs it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import lark

from madsl.errors import did_you_mean
from madsl.lang.topology.nodes import (
    BRANCH_ATTRIBUTES,
    GROUP_ATTRIBUTES,
    GROUP_DEFAULTS,
    MAX_BLOCKS,
    MAX_INTEGER,
    POSITIVE_NUMBER,
    Block,
    Fork,
    Group,
    Layer,
    Parallel,
    Repeat,
    Settings,
    Span,
    Value,
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class TransformError(Exception):
    """What the transformer finds wrong, and where. Lark wraps whatever a transformer raises in a
    VisitError; `parse` unwraps this one into a TopologySyntaxError."""

    def __init__(self, message: str, span: Span, expected: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message, self.span, self.expected, self.hint = message, span, expected, hint


def _span(meta: Any) -> Span:
    """Where a rule's match was written."""
    length = (meta.end_pos - meta.start_pos) if not meta.empty else 1
    return Span(meta.line, meta.column, max(1, length))


def token_span(tok: lark.Token) -> Span:
    """Where a token was written."""
    return Span(tok.line, tok.column, max(1, len(tok)))


@lark.v_args(meta=True)
class TreeToData(lark.Transformer):
    """The parse tree -> plain data, bottom up: one method per rule of grammar/topology.lark."""

    def start(self, meta, children):
        return children[0]

    def sequence(self, meta, children):
        return tuple(children)

    def item(self, meta, children):
        if len(children) == 1:
            return children[0]
        count_tok, node = children
        count = _count(count_tok)
        if isinstance(node, Repeat):  # 2(H:A)x3: both counts multiply
            return Repeat(node.node, count * node.count)
        return Repeat(node, count) if count != 1 else node

    def group(self, meta, children):
        sequences, attrs, count = [], (), None
        for child in children:
            if isinstance(child, tuple) and child and child[0] == "attrs":
                attrs = child[1]
            elif isinstance(child, tuple):
                sequences.append(child)
            else:
                count = child
        for key, value, key_span, value_span in attrs:
            _check_group_attribute(key, value, key_span, value_span, branches=len(sequences))
        # a number attribute is a float however written (linear_std=1 is linear_std=1.0: one group)
        attrs = tuple(
            (k, float(v), *spans) if GROUP_ATTRIBUTES.get(k) == POSITIVE_NUMBER else (k, v, *spans)
            for k, v, *spans in attrs
        )
        attrs = tuple(a for a in attrs if GROUP_DEFAULTS.get(a[0], object()) != a[1])
        body = sequences[0] if len(sequences) == 1 else (Fork(tuple(sequences)),)
        group = Group(body, _settings(attrs, meta), _span(meta))
        return Repeat(group, count) if count not in (None, 1) else group

    def repeat(self, meta, children):
        return _count(children[1])

    def block(self, meta, children):
        inject = None
        if isinstance(children[0], tuple) and children[0] and children[0][0] == "inject":
            inject, children = children[0][1], children[1:]
        mixer = children[0]
        channel = children[1] if len(children) > 1 else None
        return Block(mixer, channel, inject)

    def inject(self, meta, children):
        return ("inject", children[0])

    def parallel(self, meta, children):
        return Parallel(tuple(children), _span(meta))

    def layer(self, meta, children):
        symbol_tok = children[0]
        tag, overrides = None, ()
        for child in children[1:]:
            if isinstance(child, str) and not isinstance(child, tuple):
                tag = child
            else:
                overrides = child[1]
        return Layer(
            str(symbol_tok),
            _settings(overrides, meta),
            tag,
            token_span(symbol_tok),
            tuple((k, ks, vs) for k, _, ks, vs in overrides),
        )

    def tag(self, meta, children):
        return str(children[0])

    def attrs(self, meta, children):
        return ("attrs", tuple(children))

    def setting(self, meta, children):
        key_tok, (value, value_span) = children
        return (str(key_tok), value, token_span(key_tok), value_span)

    def number(self, meta, children):
        return _number(children[0]), token_span(children[0])

    def word(self, meta, children):
        text = str(children[0])
        value: Value = (
            {"true": True, "false": False, "null": None}.get(text.lower(), text)
            if text.lower() in ("true", "false", "null")
            else text
        )
        return value, token_span(children[0])

    def string(self, meta, children):
        text = str(children[0])[1:-1]
        if _CONTROL.search(text):
            raise TransformError(
                "a quoted value cannot contain control characters (newlines, tabs, ...)",
                token_span(children[0]),
                hint="write the value on one line",
            )
        return text, token_span(children[0])


def _check_group_attribute(key: str, value: Value, key_span: Span, value_span: Span, *, branches: int) -> None:
    allowed = GROUP_ATTRIBUTES.get(key)
    if allowed is None:
        raise TransformError(
            f"unknown group attribute {key!r}",
            key_span,
            expected=", ".join(GROUP_ATTRIBUTES),
            hint=did_you_mean(key, GROUP_ATTRIBUTES),
        )
    if allowed == POSITIVE_NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise TransformError(
                f"{key} must be a positive number, got {value!r}",
                value_span,
                expected=POSITIVE_NUMBER,
                hint=f"for example {key}=0.02",
            )
    elif value not in allowed:
        raise TransformError(
            f"{key} must be one of {', '.join(allowed)}, got {value!r}",
            value_span,
            hint=did_you_mean(str(value), allowed),
        )
    if key in BRANCH_ATTRIBUTES and branches == 1:
        raise TransformError(
            f"{key} applies to a group of branches, and this group has one",
            key_span,
            hint=f"separate the branches with '|': (Ag:Al | 2Mb){{{key}={value}}}",
        )
    if value == "gated_soft" and branches != 2:  # its two gates are one number a and 1 - a
        raise TransformError(
            f"{key}=gated_soft joins exactly two branches, and this group has {branches}",
            value_span,
            hint="use gated for more branches",
        )


def _settings(raw: tuple, meta: Any) -> Settings:
    seen: dict[str, Value] = {}
    for key, value, key_span, _ in raw:
        if key in seen:
            raise TransformError(f"{key!r} is set twice", key_span)
        seen[key] = value
    return tuple(sorted(seen.items()))


def _count(tok: lark.Token) -> int:
    digits = str(tok).lstrip("0")
    if len(digits) > len(str(MAX_BLOCKS)) or int(digits or 0) > MAX_BLOCKS:
        shown = digits if len(digits) <= 20 else f"{digits[:8]}... ({len(digits):,} digits)"
        raise TransformError(
            f"a count of {shown} is beyond the limit of {MAX_BLOCKS:,} blocks",
            token_span(tok),
            hint="check the repeat counts",
        )
    value = int(digits or 0)
    if value < 1:
        raise TransformError(
            f"a count must be at least 1, got {value}",
            token_span(tok),
            hint="leave the layer or group out instead of repeating it 0 times",
        )
    return value


def _number(tok: lark.Token) -> int | float:
    """A parameter value: a 64-bit integer or a finite float (nothing rounds to inf or 0 unnoticed)."""
    text = str(tok)
    mantissa = re.split("[eE]", text)[0]
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            raise TransformError(
                f"{shortened(text)} is out of range",
                token_span(tok),
                expected="a finite number (at most about 1.8e308)",
            )
        if value == 0 and any(c in "123456789" for c in mantissa):
            raise TransformError(
                f"{shortened(text)} is too small to represent; it would read as 0",
                token_span(tok),
                expected="a number at least about 2.2e-308 in size, or 0",
            )
        return value
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(MAX_INTEGER)) or int(digits or 0) > MAX_INTEGER:
        raise TransformError(
            f"the integer {shortened(text)} is too large",
            token_span(tok),
            expected=f"an integer of at most {MAX_INTEGER:,} in size",
        )
    return int(text)


def shortened(text: str) -> str:
    """A literal as an error message quotes it: a long one cut, with its length."""
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} characters)"
