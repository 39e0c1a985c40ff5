"""The public face of specs at its first address: `madsl.spec` is `madsl.lang.spec` (the language's
spec files -> Spec; see madsl/lang/spec/__init__.py)."""

from __future__ import annotations

from madsl.lang.spec import (
    DEFAULT_SEQ_LEN,
    Spec,
    create_primitive,
    load_spec,
    resolve_channels,
    spec_from_data,
    spec_from_topology,
    spec_with,
)

__all__ = [
    "DEFAULT_SEQ_LEN",
    "Spec",
    "create_primitive",
    "load_spec",
    "resolve_channels",
    "spec_from_data",
    "spec_from_topology",
    "spec_with",
]
