"""YAML with source locations.

Specs are read with `yaml.safe_load` semantics, in one pass: the text is composed
into a node tree once, the tree gives every key and value its line and column (so
schema errors point at the exact spot in the file), and the same tree is then
constructed into plain data. Duplicate keys are an error (PyYAML would silently
keep the last one). `Located.position` maps a position inside a string value
(quoted, or a `|`/`>` block scalar) back to the file's line and column.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from madsl.errors import Location, MadslError

KeyPath = tuple[Any, ...]
MAX_SPEC_BYTES = 128 * 1024  # a spec is a page of YAML; more is not a spec (and would take long to read)


@dataclass
class Located:
    """Parsed YAML data and the locations of its keys and values, by key path."""

    data: Any
    file: str
    text: str
    key_locs: dict[KeyPath, Location]
    value_locs: dict[KeyPath, Location]
    value_styles: dict[KeyPath, str | None]  # scalar style of a value: None (plain), "'", '"', "|", ">"

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1] if 0 < number <= len(lines) else ""

    def key(self, path: KeyPath) -> Location:
        """Where the key at `path` is written (falls back to its parents)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.key_locs:
                return self.key_locs[path[:n]]
        return Location(self.file, 1, 1, self.line(1))

    def value(self, path: KeyPath) -> Location:
        """Where the value at `path` is written (falls back to its key)."""
        return self.value_locs.get(path) or self.key(path)

    def position(self, path: KeyPath, line: int, column: int, length: int = 1) -> Location:
        """Where character (`line`, `column`) (1-based) of the string value at `path` is written in the file.

        Plain and quoted scalars start where the value does (after the opening quote); a block
        scalar (`|` or `>`) starts on the next line, each line after its indentation, and a
        folded one (`>`) joined its lines with single spaces, so its one long line is walked
        back over the file's lines. Escapes in double-quoted strings are not accounted for."""
        start = self.value(path)
        style = self.value_styles.get(path)
        if style in ("|", ">"):
            file_line = start.line + line
            if style == ">":
                file_line = start.line + 1
                while True:
                    content = self.line(file_line).strip()
                    if column <= len(content) + 1 or not content:
                        break
                    column -= len(content) + 1
                    file_line += 1
            text = self.line(file_line)
            return Location(self.file, file_line, len(text) - len(text.lstrip(" ")) + column, text, length)
        first_column = start.column + (1 if style in ("'", '"') else 0)
        file_line = start.line + line - 1
        file_column = (first_column if line == 1 else 1) + column - 1
        return replace(start, line=file_line, column=file_column, source_line=self.line(file_line), length=length)


def _loc(file: str, text_lines: list[str], mark: yaml.Mark, end: yaml.Mark | None = None) -> Location:
    line = mark.line + 1
    src = text_lines[mark.line] if mark.line < len(text_lines) else ""
    length = 1
    if end is not None and end.line == mark.line:
        length = max(1, end.column - mark.column)
    return Location(file, line, mark.column + 1, src, length)


def _read(path: Path | str, file: str) -> str:
    """A spec file's text: at most MAX_SPEC_BYTES of UTF-8; else a MadslError that says why not."""
    try:
        with open(path, "rb") as f:  # read at most one byte past the limit (a spec may be /dev/zero)
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise MadslError(
                f"{file} is larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is at most that long",
                Location(file),
                hint="is this a spec file?",
            )
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise MadslError(f"no such spec file: {file}", hint="check the path") from None
    except UnicodeDecodeError:
        raise MadslError(f"{file} is not UTF-8 text", Location(file), hint="a spec is a YAML text file") from None
    except IsADirectoryError:
        raise MadslError(
            f"{file} is a directory", Location(file), hint=f"give the spec files in it: {file}/*.mad"
        ) from None
    except PermissionError:
        raise MadslError(f"cannot read {file}: permission denied", Location(file)) from None
    except OSError as err:  # a path under a file, a name too long, an I/O error, ...
        raise MadslError(f"cannot read {file}: {err.strerror or err}", Location(file)) from None


def load(path: Path | str, text: str | None = None) -> Located:
    file = str(path)
    if text is None:
        text = _read(path, file)
    lines = text.splitlines()
    try:
        _check_shape(text)
        loader = _Loader(text)
        try:
            # what yaml.safe_load does, split in two so the node tree is walked for locations
            # before construction (construction flattens `<<` merge keys into the tree)
            node = loader.get_single_node()
            located = Located(None, file, text, {}, {}, {})
            if node is not None:
                _walk(node, (), located, lines, loader)
            located.data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        loc = _loc(file, lines, mark) if mark else Location(file)
        problem = (err.problem or err.context or "invalid YAML").strip()
        hint = None
        if "\t" in (loc.source_line or ""):
            hint = "YAML does not allow tabs for indentation; use spaces"
        elif "mapping values are not allowed" in problem:
            hint = "a value containing ': ' must be quoted"
        raise MadslError(f"invalid YAML: {problem}", loc, hint=hint) from None
    except yaml.reader.ReaderError as err:  # a character YAML does not allow: locate it in the text
        bad = yaml.reader.Reader.NON_PRINTABLE.search(text)
        position = bad.start() if bad else min(err.position, len(text))
        before = text[:position]
        line = before.count("\n") + 1
        column = position - (before.rfind("\n") + 1) + 1
        source = text.split("\n")[line - 1]
        char = text[position] if position < len(text) else chr(err.character)
        raise MadslError(
            f"invalid YAML: the character {char!r} is not allowed in a YAML file",
            Location(file, line, column, source),
            hint='remove it, or write it as an escape in a double-quoted string ("\\x07")',
        ) from None
    except yaml.YAMLError as err:
        raise MadslError(f"invalid YAML: {err}", Location(file)) from None
    return located


# --- limits ---------------------------------------------------------------------------------

MAX_DEPTH = 64  # lists and mappings inside each other
MAX_VALUES = 10_000  # values in the document, each alias counted as the values it stands for
MAX_INTEGER = 2**63 - 1  # as in a topology: numbers are 64-bit integers or finite floats


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader (pure Python, so marks are the same on every install), except that
    numbers YAML can write but a spec cannot use are located errors: integers past 64 bits (or
    Python's 4,300-digit limit), and infinite or NaN floats."""

    def construct_yaml_int(self, node):
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # past Python's 4,300-digit limit
            value = None
        if value is None or abs(value) > MAX_INTEGER:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the integer {_short(node.value)} is too large; integers are at most {MAX_INTEGER:,} in size",
                node.start_mark,
            )
        return value

    def construct_yaml_float(self, node):
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"{_short(node.value)} is not a finite number; non-finite numbers are not allowed",
                node.start_mark,
            )
        return value


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)
# YAML 1.1 (PyYAML) reads 1e-3, 2E+5 and 2.5e11 as strings, a float there needing a dot and a signed
# exponent; YAML 1.2, JSON and
# the editors' language server read them as numbers, and so does every file madsl reads: this is
# the one place numbers are resolved (the readers of settings, studies and searches take numbers)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def scalar(text: str) -> Any:
    """One value written on the command line (`--set lr=1e-3`), read as a file's values are;
    yaml.YAMLError where it is not one."""
    return yaml.load(text, Loader=_Loader)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 24 else f"{text[:12]!r}... ({len(text):,} characters)"


def _check_shape(text: str) -> None:
    """One pass over the YAML events, before any node is built: bound the nesting (the
    composer recurses) and the number of values with every alias expanded (a few lines of
    aliases can stand for a billion values), so that everything after is linear in the file."""
    expanded: dict[str, int] = {}  # anchor -> how many values it stands for
    open_: list[tuple[str | None, int]] = []  # collections being read: (anchor, values before it)
    values = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_):
                raise yaml.MarkedYAMLError(
                    None,
                    None,
                    f"the alias *{event.anchor} is inside the value it names (a value cannot contain itself)",
                    event.start_mark,
                )
            values += expanded.get(event.anchor, 1)  # an undefined alias: the composer reports it
        elif isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            values += 1
            if isinstance(event, yaml.ScalarEvent):
                if event.anchor:
                    expanded[event.anchor] = 1
            else:
                if len(open_) >= MAX_DEPTH:
                    raise yaml.MarkedYAMLError(
                        None, None, f"lists and mappings are nested more than {MAX_DEPTH} deep", event.start_mark
                    )
                open_.append((event.anchor, values - 1))
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, before = open_.pop()
            if anchor:
                expanded[anchor] = values - before
        if values > MAX_VALUES:
            raise yaml.MarkedYAMLError(
                None,
                None,
                f"the document holds more than {MAX_VALUES:,} values (aliases counted as the values they stand for)",
                event.start_mark,
            )


def _walk(node: yaml.Node, path: KeyPath, out: Located, lines: list[str], loader: yaml.SafeLoader) -> None:
    out.value_locs[path] = _loc(out.file, lines, node.start_mark, node.end_mark)
    if isinstance(node, yaml.ScalarNode):
        out.value_styles[path] = node.style
    elif isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node, merged in _pairs(node):
            where = _loc(out.file, lines, key_node.start_mark, key_node.end_mark)
            if not isinstance(key_node, yaml.ScalarNode):
                raise MadslError("a key must be a plain value (a name or a number), not a list or mapping", where)
            key = loader.construct_object(key_node)
            if not isinstance(key, (str, int, float, type(None))):  # e.g. `!!set a:` or a date
                raise MadslError(
                    f"a key must be a name or a number, not {type(key).__name__} {_short(str(key))}", where
                )
            if key in seen:
                if merged:  # a key this mapping (or an earlier merge) already sets wins, as YAML says
                    continue
                raise MadslError(
                    f"duplicate key {key!r}",
                    where,
                    hint=f"it was already set on line {seen[key].start_mark.line + 1}; keep one",
                )
            seen[key] = key_node
            out.key_locs[path + (key,)] = where
            _walk(value_node, path + (key,), out, lines, loader)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.key_locs[path + (i,)] = _loc(out.file, lines, item.start_mark, item.end_mark)
            _walk(item, path + (i,), out, lines, loader)


_MERGE = "tag:yaml.org,2002:merge"


def _pairs(node: yaml.MappingNode):
    """A mapping's (key, value, merged) pairs in the order YAML gives them precedence: its own
    keys, then those of each mapping merged in with `<<` (located where they are written)."""
    merges: list[tuple[yaml.Node, yaml.Node]] = []
    for key_node, value_node in node.value:
        if key_node.tag == _MERGE:
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            merges.extend((key_node, source) for source in sources)
        else:
            yield key_node, value_node, False
    for merge_key, source in merges:
        if not isinstance(source, yaml.MappingNode):
            continue  # construction reports it, located
        if any(key_node.tag == _MERGE for key_node, _ in source.value):
            # PyYAML merges a merged mapping's own merges wrongly (its keys lose to the ones it
            # merged): refuse rather than read something else than what is written
            raise yaml.MarkedYAMLError(
                None,
                None,
                "this << merges a mapping that itself uses <<; merges inside merges are not supported",
                merge_key.start_mark,
            )
        for key_node, value_node in source.value:
            yield key_node, value_node, True
