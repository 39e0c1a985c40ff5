"""Spec files (`.mad`, YAML) -> validated `Spec` objects: the spec half of the language.

    load_spec(path)            a spec file, with what it `extends:` merged in
    spec_with(base, changes)   a loaded spec with top-level keys replaced (a sweep's variant)
    spec_from_data(data)       already-merged data (e.g. stored with a saved model)
    spec_from_topology(text)   a topology string and the stdlib defaults (`madsl compile -t`)

One module per concern (data flows down the list):

    named.py     the read policy of a named file (`extends:`, a sweep's `specs:`)
    files.py     spec files -> one merged mapping (`extends:`) and SourceMap (where each value
                 is written)
    keys.py      the top-level keys, their types and choices; the budget section
    symbols.py   the symbol table: stdlib symbols + the spec's `layers:`
    spec.py      Spec: channel_for, primitive_for, the canonical form, identity, identity_text,
                 hash; create_primitive, resolve_channels
    build.py     load_spec, spec_with, spec_from_data, spec_from_topology: the above put
                 together, every independent error collected
"""

from __future__ import annotations

from madsl.lang.spec.build import load_spec, spec_from_data, spec_from_topology, spec_with
from madsl.lang.spec.spec import DEFAULT_SEQ_LEN, Spec, create_primitive, resolve_channels

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
