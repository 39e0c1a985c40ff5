"""The language: what a spec says, read, checked and resolved; no torch, no runner.

Data flows down the list; nothing here imports the plan (madsl.graph), the compiler, the runner or
the command line. Below it: madsl.errors (located diagnostics), madsl.resources (where the grammar
and stdlib data lie), madsl.primitives (each primitive's hyperparameters and accounting).

    yamlsource.py   YAML parsed once, with line/column of every key and value (and of a position
                    inside a quoted or block-scalar string); spec, sweep, study and search files;
                    the one number resolver (1e-3 is a number, as YAML 1.2 reads it)
    declare.py      the configuration language: Kind, Key, Section; every key of the eval:, sweep,
                    study and search files declared once, read (located errors) and in its schema
    budget.py       budget bounds (`<= 5M`, `500k ± 10%`) and their check against totals
    stdlib.py       the layer library (stdlib/*.yaml): primitives, their defaults, the symbols
    topology/       topology strings <-> plain data: nodes, transform (the Lark transformer),
                    parse, expand, printer (the canonical form); its __init__ is the public face
    spec/           spec files -> Spec: named (the read policy), files (`extends:`, SourceMap),
                    keys (the top-level keys, the budget section), symbols (the symbol table),
                    spec (Spec: the canonical form, identity, identity_text, hash), build
                    (load_spec, spec_from_data, ...)

`madsl.topology` and `madsl.spec` are the public faces of topology/ and spec/ at their first
addresses; madsl/__init__.py exports Spec, load_spec and spec_from_topology.
"""
