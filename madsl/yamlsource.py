"""YAML with source locations.

Specs are read with `yaml.safe_load` semantics; alongside, the composed node
tree gives every key and value its line and column, so that schema errors can
point at the exact spot in the file. Duplicate keys are an error (PyYAML would
silently keep the last one).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import Location, MadslError

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


def _loc(file: str, text_lines: list[str], mark: yaml.Mark, end: yaml.Mark | None = None) -> Location:
    line = mark.line + 1
    src = text_lines[mark.line] if mark.line < len(text_lines) else ""
    length = 1
    if end is not None and end.line == mark.line:
        length = max(1, end.column - mark.column)
    return Location(file, line, mark.column + 1, src, length)


def load(path: Path | str, text: str | None = None) -> Located:
    file = str(path)
    if text is None:
        try:
            with open(path, "rb") as f:  # read at most one byte past the limit (a spec may be /dev/zero)
                raw = f.read(MAX_SPEC_BYTES + 1)
            if len(raw) > MAX_SPEC_BYTES:
                raise MadslError(f"{file} is larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is at most that long",
                                 Location(file), hint="is this a spec file?")
            text = raw.decode("utf-8")
        except FileNotFoundError:
            raise MadslError(f"no such spec file: {file}", hint="check the path") from None
        except UnicodeDecodeError:
            raise MadslError(f"{file} is not UTF-8 text", Location(file), hint="a spec is a YAML text file") from None
        except IsADirectoryError:
            raise MadslError(f"{file} is a directory", Location(file), hint=f"give the spec files in it: {file}/*.mad") \
                from None
        except PermissionError:
            raise MadslError(f"cannot read {file}: permission denied", Location(file)) from None
        except OSError as err:  # a path under a file, a name too long, an I/O error, ...
            raise MadslError(f"cannot read {file}: {err.strerror or err}", Location(file)) from None
    lines = text.splitlines()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
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
    except yaml.YAMLError as err:
        raise MadslError(f"invalid YAML: {err}", Location(file)) from None
    located = Located(data, file, text, {}, {}, {})
    if node is not None:
        _walk(node, (), located, lines)
    return located


def _walk(node: yaml.Node, path: KeyPath, out: Located, lines: list[str]) -> None:
    out.value_locs[path] = _loc(out.file, lines, node.start_mark, node.end_mark)
    if isinstance(node, yaml.ScalarNode):
        out.value_styles[path] = node.style
    elif isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if not isinstance(key_node, yaml.ScalarNode) \
                else _scalar(key_node)
            if key == "<<":
                continue
            if key in seen:
                raise MadslError(f"duplicate key {key!r}", _loc(out.file, lines, key_node.start_mark,
                                                               key_node.end_mark),
                                 hint=f"it was already set on line {seen[key].start_mark.line + 1}; keep one")
            seen[key] = key_node
            out.key_locs[path + (key,)] = _loc(out.file, lines, key_node.start_mark, key_node.end_mark)
            _walk(value_node, path + (key,), out, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.key_locs[path + (i,)] = _loc(out.file, lines, item.start_mark, item.end_mark)
            _walk(item, path + (i,), out, lines)


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()
