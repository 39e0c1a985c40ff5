"""`parse`: a topology string -> plain data, or a TopologySyntaxError located inside the string.

The grammar (grammar/topology.lark) is the single source of the syntax; Lark parses with it, the
transformer of transform.py turns the tree into data, and this module turns every way
that can fail (a limit, a character or token the grammar does not expect, the string ending too
early, a value the transformer rejects) into one kind of error with a line, a column and, where
one helps, a hint. `locate` places such an error in the file the topology was written in.
"""

from __future__ import annotations

import re
from functools import cache

import lark

from madsl.errors import Location, MadslError
from madsl.lang.topology.expand import size
from madsl.lang.topology.nodes import MAX_BLOCKS, MAX_CHARS, MAX_NESTING, Span, Topology
from madsl.lang.topology.transform import TransformError, TreeToData, shortened, token_span
from madsl.resources import grammar_file


class TopologySyntaxError(MadslError):
    """A MadslError located inside a topology string (span in string coordinates)."""

    def __init__(
        self, message: str, span: Span, *, expected: str | None = None, hint: str | None = None, text: str | None = None
    ):
        super().__init__(
            message, Location(None, span.line, span.column, None, span.length), expected=expected, hint=hint
        )
        self.span = span


@cache
def _parser() -> lark.Lark:
    return lark.Lark(
        grammar_file().read_text(encoding="utf-8"), parser="lalr", propagate_positions=True, maybe_placeholders=False
    )


# Friendly names for the grammar's terminals in "expected ..." messages.
_TERMINALS = {
    "COUNT": "a count",
    "SYMBOL": "a layer symbol",
    "TAG": "a tag name",
    "NAME": "a parameter name",
    "NUMBER": "a number",
    "STRING": "a quoted string",
    "REPEAT": "'x' and a count",
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "COLON": "':'",
    "MINUS": "'-'",
    "VBAR": "'|'",
    "COMMA": "','",
    "EQUAL": "'='",
    "HASH": "'#'",
    "$END": "the end of the topology",
}


def _expected(names) -> str:
    friendly = sorted({_TERMINALS.get(n, n) for n in names})
    return ", ".join(friendly)


def _prescan(text: str) -> None:
    """Enforce the size and nesting limits in one linear pass, before the parser runs:
    the parser and the tree walks are the expensive (and recursive) part."""
    if len(text) > MAX_CHARS:
        raise TopologySyntaxError(
            f"the topology is {len(text):,} characters long; the limit is {MAX_CHARS:,}",
            Span(1, 1, 1),
            hint="repeat a group, (H:A)x12, instead of writing it out",
        )
    depth, separators, line, column, i = 0, 0, 1, 1, 0
    while i < len(text):
        char = text[i]
        if char in "\"'":  # a quoted value: its characters are not structure
            end = text.find(char, i + 1)
            if end < 0:
                return  # unterminated: the parser reports it
            skipped = text[i : end + 1]
            if "\n" in skipped:
                line, column = line + skipped.count("\n"), len(skipped) - skipped.rfind("\n")
            else:
                column += len(skipped)
            i = end + 1
            continue
        if char == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise TopologySyntaxError(
                    f"groups are nested more than {MAX_NESTING} deep",
                    Span(line, column, 1),
                    hint="a deeper nesting is a typo, not an architecture",
                )
        elif char == ")":
            depth = max(0, depth - 1)
        elif char in ":|":  # every ':' or '|' separates two blocks (or branches) of the expansion
            separators += 1
            if separators >= MAX_BLOCKS:
                raise TopologySyntaxError(
                    f"the topology has more than {MAX_BLOCKS:,} blocks; the limit is {MAX_BLOCKS:,}",
                    Span(line, column, 1),
                    hint="repeat a group, (H:A)x12, instead of writing it out",
                )
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
        raise TopologySyntaxError(
            "the topology is empty", Span(1, 1, 1), expected="a layer symbol, e.g. 'H:A' or '(2H:2A)x6'"
        )
    _prescan(text)
    try:
        tree = _parser().parse(text)
        parsed = TreeToData().transform(tree)
    except lark.exceptions.VisitError as err:
        inner = err.orig_exc
        if isinstance(inner, TransformError):
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
        raise TopologySyntaxError(
            f"unexpected character {char!r}",
            Span(err.line, err.column, 1),
            expected=_expected(err.allowed or []),
            hint=hint,
        ) from None
    except lark.exceptions.UnexpectedEOF as err:
        raise TopologySyntaxError(
            "the topology ends too early", _end_span(text), expected=_expected(err.expected)
        ) from None
    except lark.exceptions.UnexpectedToken as err:
        raise _unexpected_token(err, text) from None
    blocks_total = size(parsed)
    if blocks_total > MAX_BLOCKS:
        first = text.split("\n")[0]
        raise TopologySyntaxError(
            f"the topology expands to {blocks_total:,} blocks; the limit is {MAX_BLOCKS:,}",
            Span(1, 1, max(1, len(first.rstrip()))),
            hint="check the repeat counts",
        )
    return parsed


def _unexpected_token(err: lark.exceptions.UnexpectedToken, text: str) -> TopologySyntaxError:
    """The error for a token the grammar does not expect where it stands, with a hint where a
    common slip explains it."""
    tok = err.token
    if tok.type == "$END":
        span = _end_span(text)
        message = "the topology ends too early"
    else:
        span = token_span(tok)
        message = f"unexpected {shortened(str(tok))!r}"
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
        hint = _tag_hint(text[: tok.start_pos])
    elif tok.type == "RBRACE" and "NAME" in err.expected:
        hint = "remove the ',' after the last setting"
    return TopologySyntaxError(message, span, expected=_expected(err.expected), hint=hint)


def _tag_hint(before: str) -> str:
    """Why a '#' cannot stand where it does, from what precedes it."""
    before = before.rstrip()
    attributes_of = before[: before.rfind("{")].rstrip() if before.endswith("}") else None
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
