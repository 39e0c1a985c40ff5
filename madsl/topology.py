"""Topology strings -> plain data, and back.

`parse(text)` runs the Lark grammar (grammar/topology.lark) and turns the tree
into frozen dataclasses. `expand()` unrolls repeats and drops groups that carry
no attributes, giving the architecture's one true shape; `canonical()` prints
an expanded topology in one normal form, so that two spellings of the same
architecture print, and compare, equal:

    canonical(expand(parse("(1H:1A)x12"))) == "(H:A)x12"
    parse(canonical(t)) expands to the same thing as t   (round trip)

Nothing here knows what a symbol means; the spec layer resolves symbols.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Iterator, Union

import lark

from .errors import Location, MadslError
from .resources import grammar_file

Value = Union[int, float, bool, str, None]
Settings = tuple[tuple[str, Value], ...]  # sorted (key, value) pairs

POSITIVE_NUMBER = "a positive number"
# A group's attributes and their values (docs/language.md): the connection around it, the
# splitter and combiner of a group of branches, the pre-norm kind and the Linear init of its layers
GROUP_ATTRIBUTES: dict[str, Any] = {
    "residual": ("add", "none", "gated"),
    "split": ("copy", "res", "gated", "gated_soft"),
    "combine": ("mean", "res", "gated", "gated_soft"),
    "norm": ("rms", "layer"),
    "linear_std": POSITIVE_NUMBER,
}
BRANCH_ATTRIBUTES = ("split", "combine")  # only a group of branches has a splitter and a combiner
# what a bare group already is: dropped, so that both spellings are one architecture
GROUP_DEFAULTS = {"residual": "none", "split": "copy", "combine": "mean"}
NO_CHANNEL = "none"  # `H-none`: a block without a channel mixer

# Limits, checked before the expensive work so that any input answers in seconds
# (docs/language.md#limits). A topology longer than these is a typo, not an architecture.
MAX_BLOCKS = 1024  # after expansion; a parallel block counts once per branch
MAX_NESTING = 32  # parentheses inside parentheses
MAX_CHARS = 65_536  # the topology string itself
MAX_INTEGER = 2**63 - 1  # parameter values are 64-bit integers or finite floats


@dataclass(frozen=True)
class Span:
    """Where a node was written inside the topology string (1-based line and column)."""

    line: int
    column: int
    length: int


@dataclass(frozen=True)
class Layer:
    symbol: str
    overrides: Settings = ()
    tag: str | None = None
    span: Span | None = field(default=None, compare=False, repr=False)
    # where each override's key and value were written: (key, key span, value span)
    override_spans: tuple[tuple[str, Span, Span], ...] = field(default=(), compare=False, repr=False)
    # the type of each override, so that 1, 1.0 and true (equal in Python) stay three layers
    override_types: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "override_types", tuple(type(v).__name__ for _, v in self.overrides))


@dataclass(frozen=True)
class Parallel:
    """Sequence mixers applied to the same input; their outputs are summed."""

    branches: tuple[Layer, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    """A residual block: a sequence mixer and (optionally) its channel mixer.

    channel is None when the topology does not name one (the spec's default
    applies) and Layer("none") when the topology asks for none."""

    mixer: Layer | Parallel
    channel: Layer | None = None


@dataclass(frozen=True)
class Group:
    body: tuple["Node", ...]
    attrs: Settings = ()
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Fork:
    """The branches of a group written `(X | Y)`: sub-stacks that each read the group's input
    through its splitter, and whose outputs its combiner joins. Only ever a group's whole body."""

    branches: tuple[tuple["Node", ...], ...]


@dataclass(frozen=True)
class Repeat:
    node: Union[Block, Group]
    count: int


Node = Union[Block, Group, Repeat, Fork]
Topology = tuple[Node, ...]

# --- parsing ------------------------------------------------------------------------

@cache
def _parser() -> lark.Lark:
    return lark.Lark(grammar_file().read_text(encoding="utf-8"), parser="lalr",
                     propagate_positions=True, maybe_placeholders=False)


def _span(meta: Any) -> Span:
    length = (meta.end_pos - meta.start_pos) if not meta.empty else 1
    return Span(meta.line, meta.column, max(1, length))


def _tok_span(tok: lark.Token) -> Span:
    return Span(tok.line, tok.column, max(1, len(tok)))


@lark.v_args(meta=True)
class _ToData(lark.Transformer):
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
        attrs = tuple((k, float(v), *spans) if GROUP_ATTRIBUTES.get(k) == POSITIVE_NUMBER else (k, v, *spans)
                      for k, v, *spans in attrs)
        attrs = tuple(a for a in attrs if GROUP_DEFAULTS.get(a[0], object()) != a[1])
        body = sequences[0] if len(sequences) == 1 else (Fork(tuple(sequences)),)
        group = Group(body, _settings(attrs, meta), _span(meta))
        return Repeat(group, count) if count not in (None, 1) else group

    def repeat(self, meta, children):
        return _count(children[1])

    def block(self, meta, children):
        mixer = children[0]
        channel = children[1] if len(children) > 1 else None
        return Block(mixer, channel)

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
        return Layer(str(symbol_tok), _settings(overrides, meta), tag, _tok_span(symbol_tok),
                     tuple((k, ks, vs) for k, _, ks, vs in overrides))

    def tag(self, meta, children):
        return str(children[0])

    def attrs(self, meta, children):
        return ("attrs", tuple(children))

    def setting(self, meta, children):
        key_tok, (value, value_span) = children
        return (str(key_tok), value, _tok_span(key_tok), value_span)

    def number(self, meta, children):
        return _number(children[0]), _tok_span(children[0])

    def word(self, meta, children):
        text = str(children[0])
        value: Value = {"true": True, "false": False, "null": None}.get(text.lower(), text) \
            if text.lower() in ("true", "false", "null") else text
        return value, _tok_span(children[0])

    def string(self, meta, children):
        text = str(children[0])[1:-1]
        if _CONTROL.search(text):
            raise _TopologyError("a quoted value cannot contain control characters (newlines, tabs, ...)",
                                 _tok_span(children[0]), hint="write the value on one line")
        return text, _tok_span(children[0])


def _check_group_attribute(key: str, value: Value, key_span: Span, value_span: Span, *, branches: int) -> None:
    allowed = GROUP_ATTRIBUTES.get(key)
    if allowed is None:
        raise _TopologyError(f"unknown group attribute {key!r}", key_span, expected=", ".join(GROUP_ATTRIBUTES),
                             hint=_nearest(key, GROUP_ATTRIBUTES))
    if allowed == POSITIVE_NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise _TopologyError(f"{key} must be a positive number, got {value!r}", value_span,
                                 expected=POSITIVE_NUMBER, hint=f"for example {key}=0.02")
    elif value not in allowed:
        raise _TopologyError(f"{key} must be one of {', '.join(allowed)}, got {value!r}", value_span,
                             hint=_nearest(str(value), allowed))
    if key in BRANCH_ATTRIBUTES and branches == 1:
        raise _TopologyError(f"{key} applies to a group of branches, and this group has one", key_span,
                             hint=f"separate the branches with '|': (Ag:Al | 2Mb){{{key}={value}}}")
    if value == "gated_soft" and branches != 2:  # its two gates are one number a and 1 - a
        raise _TopologyError(f"{key}=gated_soft joins exactly two branches, and this group has {branches}",
                             value_span, hint="use gated for more branches")


def _settings(raw: tuple, meta: Any) -> Settings:
    seen: dict[str, Value] = {}
    for key, value, key_span, _ in raw:
        if key in seen:
            raise _TopologyError(f"{key!r} is set twice", key_span)
        seen[key] = value
    return tuple(sorted(seen.items()))


def _count(tok: lark.Token) -> int:
    digits = str(tok).lstrip("0")
    if len(digits) > len(str(MAX_BLOCKS)) or int(digits or 0) > MAX_BLOCKS:
        shown = digits if len(digits) <= 20 else f"{digits[:8]}... ({len(digits):,} digits)"
        raise _TopologyError(f"a count of {shown} is beyond the limit of {MAX_BLOCKS:,} blocks", _tok_span(tok),
                             hint="check the repeat counts")
    value = int(digits or 0)
    if value < 1:
        raise _TopologyError(f"a count must be at least 1, got {value}", _tok_span(tok),
                             hint="leave the layer or group out instead of repeating it 0 times")
    return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _number(tok: lark.Token) -> int | float:
    """A parameter value: a 64-bit integer or a finite float (nothing rounds to inf or 0 unnoticed)."""
    text = str(tok)
    mantissa = re.split("[eE]", text)[0]
    if any(c in text for c in ".eE"):
        value = float(text)
        if not math.isfinite(value):
            raise _TopologyError(f"{_short(text)} is out of range", _tok_span(tok),
                                 expected="a finite number (at most about 1.8e308)")
        if value == 0 and any(c in "123456789" for c in mantissa):
            raise _TopologyError(f"{_short(text)} is too small to represent; it would read as 0",
                                 _tok_span(tok), expected="a number at least about 2.2e-308 in size, or 0")
        return value
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(MAX_INTEGER)) or int(digits or 0) > MAX_INTEGER:
        raise _TopologyError(f"the integer {_short(text)} is too large", _tok_span(tok),
                             expected=f"an integer of at most {MAX_INTEGER:,} in size")
    return int(text)


def _short(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} characters)"


def _nearest(word: str, options) -> str | None:
    from .errors import did_you_mean
    return did_you_mean(word, options)


class _TopologyError(Exception):
    def __init__(self, message: str, span: Span, expected: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message, self.span, self.expected, self.hint = message, span, expected, hint


# Friendly names for the grammar's terminals in "expected ..." messages.
_TERMINALS = {
    "COUNT": "a count", "SYMBOL": "a layer symbol", "TAG": "a tag name", "NAME": "a parameter name",
    "NUMBER": "a number", "STRING": "a quoted string", "REPEAT": "'x' and a count",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COLON": "':'", "MINUS": "'-'", "VBAR": "'|'", "COMMA": "','", "EQUAL": "'='", "HASH": "'#'",
    "$END": "the end of the topology",
}


def _expected(names) -> str:
    friendly = sorted({_TERMINALS.get(n, n) for n in names})
    return ", ".join(friendly)


def _prescan(text: str) -> None:
    """Enforce the size and nesting limits in one linear pass, before the parser runs:
    the parser and the tree walks are the expensive (and recursive) part."""
    if len(text) > MAX_CHARS:
        raise TopologySyntaxError(f"the topology is {len(text):,} characters long; the limit is {MAX_CHARS:,}",
                                  Span(1, 1, 1), hint="repeat a group, (H:A)x12, instead of writing it out")
    depth, separators, line, column, i = 0, 0, 1, 1, 0
    while i < len(text):
        char = text[i]
        if char in "\"'":  # a quoted value: its characters are not structure
            end = text.find(char, i + 1)
            if end < 0:
                return  # unterminated: the parser reports it
            skipped = text[i:end + 1]
            if "\n" in skipped:
                line, column = line + skipped.count("\n"), len(skipped) - skipped.rfind("\n")
            else:
                column += len(skipped)
            i = end + 1
            continue
        if char == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise TopologySyntaxError(f"groups are nested more than {MAX_NESTING} deep", Span(line, column, 1),
                                          hint="a deeper nesting is a typo, not an architecture")
        elif char == ")":
            depth = max(0, depth - 1)
        elif char in ":|":  # every ':' or '|' separates two blocks (or branches) of the expansion
            separators += 1
            if separators >= MAX_BLOCKS:
                raise TopologySyntaxError(f"the topology has more than {MAX_BLOCKS:,} blocks; "
                                          f"the limit is {MAX_BLOCKS:,}", Span(line, column, 1),
                                          hint="repeat a group, (H:A)x12, instead of writing it out")
        if char == "\n":
            line, column = line + 1, 1
        else:
            column += 1
        i += 1


def _end_span(text: str) -> Span:
    lines = text.split("\n")
    return Span(len(lines), len(lines[-1].rstrip()) + 1, 1)


def parse(text: str) -> Topology:
    """Parse a topology string. Raises TopologySyntaxError (a MadslError) with the
    1-based line and column inside `text`; never another exception."""
    if not text.strip():
        raise TopologySyntaxError("the topology is empty", Span(1, 1, 1),
                                  expected="a layer symbol, e.g. 'H:A' or '(2H:2A)x6'")
    _prescan(text)
    try:
        tree = _parser().parse(text)
        parsed = _ToData().transform(tree)
    except lark.exceptions.VisitError as err:
        inner = err.orig_exc
        if isinstance(inner, _TopologyError):
            raise TopologySyntaxError(inner.message, inner.span, expected=inner.expected, hint=inner.hint) from None
        raise
    except lark.exceptions.UnexpectedCharacters as err:
        char = err.char
        hint = None
        if char == "{":
            hint = "attributes go right after a layer or a group, before any repeat: (H:A){residual=gated}x2"
        elif char in "*×xX":
            hint = "repeat a group with a suffix, (H:A)x2, or a layer with a prefix, 2H"
        elif char in "\"'":
            hint = "a quoted value needs its closing quote"
        raise TopologySyntaxError(f"unexpected character {char!r}", Span(err.line, err.column, 1),
                                  expected=_expected(err.allowed or []), hint=hint) from None
    except lark.exceptions.UnexpectedEOF as err:
        raise TopologySyntaxError("the topology ends too early", _end_span(text),
                                  expected=_expected(err.expected)) from None
    except lark.exceptions.UnexpectedToken as err:
        tok = err.token
        if tok.type == "$END":
            span = _end_span(text)
            message = "the topology ends too early"
        else:
            span = _tok_span(tok)
            message = f"unexpected {_short(str(tok))!r}"
        hint = None
        if tok.type == "RSQB" and "VBAR" in err.expected:
            hint = "parallel branches need at least two mixers: [H | mA]"
        elif tok.type == "RPAR" and "SYMBOL" in err.expected:
            hint = "a group needs at least one layer: remove '()' or put layers inside"
        elif tok.type == "COUNT" and "SYMBOL" not in err.expected:
            hint = "a count goes before a layer (4A) or after a group's 'x' ((H:A)x4)"
        elif tok.type == "LBRACE":
            hint = "attributes go right after a layer or a group, before any repeat: (H:A){residual=gated}x2"
        elif tok.type == "HASH":
            hint = _tag_hint(text[:tok.start_pos])
        elif tok.type == "RBRACE" and "NAME" in err.expected:
            hint = "remove the ',' after the last setting"
        raise TopologySyntaxError(message, span, expected=_expected(err.expected), hint=hint) from None
    blocks_total = size(parsed)
    if blocks_total > MAX_BLOCKS:
        first = text.split("\n")[0]
        raise TopologySyntaxError(f"the topology expands to {blocks_total:,} blocks; the limit is {MAX_BLOCKS:,}",
                                  Span(1, 1, max(1, len(first.rstrip()))), hint="check the repeat counts")
    return parsed


class TopologySyntaxError(MadslError):
    """A MadslError located inside a topology string (span in string coordinates)."""

    def __init__(self, message: str, span: Span, *, expected: str | None = None, hint: str | None = None,
                 text: str | None = None):
        super().__init__(message, Location(None, span.line, span.column, None, span.length),
                         expected=expected, hint=hint)
        self.span = span


def _tag_hint(before: str) -> str:
    """Why a '#' cannot stand where it does, from what precedes it."""
    before = before.rstrip()
    attributes_of = before[:before.rfind("{")].rstrip() if before.endswith("}") else None
    if before.endswith(")") or (attributes_of or "").endswith(")"):
        return "a group takes no tag; tag the layers inside it: (H#a:A)x2"
    if attributes_of is not None:
        return "a tag comes before the layer's {...}: H#a{order=3}"
    if re.search(r"#\w+$", before):
        return "a layer takes one tag: H#a"
    return "a tag follows a layer symbol: H#a"


def locate(err: MadslError, span: Span | None, text: str, base: Location | None = None) -> MadslError:
    """Give an error that happened at `span` inside topology `text` a full location.

    `base` is where the topology string starts in its file (line, column of its
    first character); without it the topology stands alone (e.g. `-t` on the CLI)."""
    if span is None:
        return err
    lines = text.split("\n")
    if base is None or base.line is None:
        src = lines[span.line - 1] if span.line - 1 < len(lines) else ""
        return err.relocated(Location(None, span.line, span.column, src, span.length))
    line = base.line + span.line - 1
    column = (base.column if span.line == 1 else 1) + span.column - 1
    return err.relocated(Location(base.file, line, column, None, span.length))


# --- structure ----------------------------------------------------------------------

def size(topology: Topology) -> int:
    """Number of blocks after expansion (a parallel block counts once per branch),
    computed without expanding."""
    total = 0
    for node in topology:
        if isinstance(node, Repeat):
            total += node.count * size((node.node,))
        elif isinstance(node, Group):
            total += size(node.body)
        elif isinstance(node, Fork):
            total += sum(size(branch) for branch in node.branches)
        else:
            total += len(node.mixer.branches) if isinstance(node.mixer, Parallel) else 1
    return total


def expand(topology: Topology) -> Topology:
    """Unroll repeats and flatten groups without attributes (a group of branches stays)."""
    out: list[Node] = []
    for node in topology:
        out.extend(_expand_node(node))
    return tuple(out)


def _expand_node(node: Node) -> Iterator[Node]:
    if isinstance(node, Repeat):
        inner = list(_expand_node(node.node))
        for _ in range(node.count):
            yield from inner
    elif isinstance(node, Group):
        body = expand(node.body)
        if node.attrs or is_forked(node):
            yield Group(body, node.attrs, node.span)
        else:
            yield from body
    elif isinstance(node, Fork):
        yield Fork(tuple(expand(branch) for branch in node.branches))
    else:
        yield node


def is_forked(group: Group) -> bool:
    """Whether a group is a group of branches, `(X | Y)`."""
    return len(group.body) == 1 and isinstance(group.body[0], Fork)


def blocks(topology: Topology) -> Iterator[Block]:
    """Every block of the expanded topology, in order (descending into groups)."""
    for node in expand(topology):
        if isinstance(node, Group):
            yield from blocks(node.body)
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from blocks(branch)
        else:
            yield node


def layers(topology: Topology) -> Iterator[Layer]:
    """Every layer occurrence as written (not expanded), for error checking."""
    for node in topology:
        if isinstance(node, Repeat):
            yield from layers((node.node,))
        elif isinstance(node, Group):
            yield from layers(node.body)
        elif isinstance(node, Fork):
            for branch in node.branches:
                yield from layers(branch)
        else:
            yield from (node.mixer.branches if isinstance(node.mixer, Parallel) else (node.mixer,))
            if node.channel is not None:
                yield node.channel


def map_blocks(topology: Topology, fn) -> Topology:
    """Apply fn to every block of an expanded topology, keeping groups."""
    out = []
    for node in topology:
        if isinstance(node, Group):
            out.append(Group(map_blocks(node.body, fn), node.attrs, node.span))
        elif isinstance(node, Fork):
            out.append(Fork(tuple(map_blocks(branch, fn) for branch in node.branches)))
        elif isinstance(node, Repeat):
            out.append(Repeat(map_blocks((node.node,), fn)[0], node.count))
        else:
            out.append(fn(node))
    return tuple(out)


# --- printing -----------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the grammar's NAME: a value that may go unquoted
_KEYWORDS = ("true", "false", "null")  # words that read back as true, false and null (any case)


def _value(v: Value) -> str:
    """A value as the parser reads it back: the same value of the same type."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        if _WORD.fullmatch(v) and v.lower() not in _KEYWORDS:
            return v
        for quote in "\"'":  # the grammar has no escapes: a string with both quotes cannot be written
            if quote not in v:
                return f"{quote}{v}{quote}"
        raise ValueError(f"{v!r} contains both quote characters and cannot be written in a topology")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"{v!r} cannot be written in a topology: numbers are finite")
    return repr(v)  # ints, and floats in Python's shortest round-tripping form (1e+16, 0.1)


def _settings_text(settings: Settings) -> str:
    return "{" + ",".join(f"{k}={_value(v)}" for k, v in settings) + "}" if settings else ""


def layer_text(layer: Layer) -> str:
    return layer.symbol + (f"#{layer.tag}" if layer.tag else "") + _settings_text(layer.overrides)


def block_text(block: Block) -> str:
    if isinstance(block.mixer, Parallel):
        mixer = "[" + " | ".join(layer_text(b) for b in block.mixer.branches) + "]"
    else:
        mixer = layer_text(block.mixer)
    return mixer + (f"-{layer_text(block.channel)}" if block.channel is not None else "")


def expanded_text(topology: Topology) -> str:
    """The fully expanded form: every block written out, separated by ' : '."""
    parts = []
    for node in expand(topology):
        if isinstance(node, Group):
            parts.append(f"({expanded_text(node.body)}){_settings_text(node.attrs)}")
        elif isinstance(node, Fork):
            parts.append(" | ".join(expanded_text(branch) for branch in node.branches))
        else:
            parts.append(block_text(node))
    return " : ".join(parts)


def canonical(topology: Topology) -> str:
    """One normal form per architecture: expanded, then compressed deterministically.

    A sequence that is k > 1 copies of a shorter one prints as (period)xk; what
    remains is run-length encoded (4A). Groups with attributes print as
    (body){attrs}."""
    return _compress(list(expand(topology)))


def _unit(node: Node) -> str:
    if isinstance(node, Group):
        return f"({_compress(list(node.body))}){_settings_text(node.attrs)}"
    if isinstance(node, Fork):
        return " | ".join(_compress(list(branch)) for branch in node.branches)
    return block_text(node)


def _compress(nodes: list[Node]) -> str:
    n = len(nodes)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and nodes[:period] * (n // period) == nodes:
            inner = _compress(nodes[:period])
            if period == 1:
                return f"{n}{inner}"
            return f"({inner})x{n // period}"
    parts, i = [], 0
    while i < n:
        j = i
        while j < n and nodes[j] == nodes[i]:
            j += 1
        unit = _unit(nodes[i])
        parts.append(f"{j - i}{unit}" if j - i > 1 else unit)
        i = j
    return ":".join(parts)
