"""`madsl compile` and `madsl expand`: a spec's layers, accounting and budget verdict, the model it
builds (`--emit torch`), a topology's expanded layers. `madsl check`, the CI gate, is check.py.

Neither imports torch (except `compile --emit torch`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from madsl.cli.arguments import positive_int
from madsl.cli.common import EXIT_BUDGET, EXIT_OK, format_word, make_console, print_whole, write_atomic
from madsl.errors import MadslError
from madsl.outputs import check_output_dir, check_output_path, output_error

if TYPE_CHECKING:
    from madsl.lang.spec import Spec


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("compile", help="account a spec layer by layer, check its budget, or build the model")
    p.add_argument("spec", nargs="?", help="a .mad spec file")
    p.add_argument("-t", "--topology", help="a topology string, with the stdlib's paper defaults")
    p.add_argument("--dim", type=positive_int, help="model width (default: the spec's, or 128 with -t)")
    p.add_argument("--vocab", type=positive_int, help="vocabulary size (embedding and head)")
    p.add_argument("--seq-len", type=positive_int, help="sequence length for KV cache and FLOPs")
    p.add_argument(
        "--format",
        "--emit",
        dest="emit",
        type=format_word,
        choices=("text", "json", "dot", "torch"),
        default="text",
        help="text (old name: summary): the layer table and budget verdict; json: the same "
        "for scripts; dot: the graph (Graphviz); torch: the built model, saved into the folder -o names "
        "(model.safetensors and config.json; --emit: old name)",
    )
    p.add_argument("-o", "--output", help="write the output to this file (--format torch: into this folder)")
    p.set_defaults(func=cmd_compile)

    p = subparsers.add_parser(
        "expand",
        help="print the fully expanded layer list of a topology (its syntax only: "
        "symbols are not looked up; compile -t checks them)",
    )
    p.add_argument("topology", help="a topology string, e.g. '(H:5A:5H:A)x2'")
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: one block per line; json: the list of blocks, each its layer symbols",
    )
    p.set_defaults(func=cmd_expand)


def _load(args) -> Spec:
    from madsl.lang.spec import load_spec, spec_from_topology

    if args.topology is not None:
        if args.spec is not None:
            raise MadslError("give either a SPEC file or -t TOPOLOGY, not both")
        return spec_from_topology(args.topology, dim=args.dim or 128, vocab=args.vocab, seq_len=args.seq_len or 128)
    if args.spec is None:
        raise MadslError(
            "nothing to compile",
            hint="give a spec file (madsl compile specs/paper/mamba.mad) or a topology (madsl compile -t '(H:A)x2')",
        )
    overrides = {
        k: v for k, v in (("dim", args.dim), ("vocab", args.vocab), ("seq_len", args.seq_len)) if v is not None
    }
    return load_spec(args.spec, overrides=overrides)


def cmd_compile(args) -> int:
    from madsl import report_text
    from madsl.fit import fit_note, fitted
    from madsl.graph import account
    from madsl.lang.budget import check

    spec = _load(args)
    if args.output and args.emit == "torch":  # before any work: a model is a folder of two files
        from madsl.model_file import FILES

        check_output_dir(args.output, "-o", lambda name: name in FILES, force=True, writes=" and ".join(FILES))
    elif args.output:
        check_output_path(args.output, "-o")
    seq_len = spec.budget_seq_len if args.seq_len is None and spec.budget_seq_len else None
    spec, solution = fitted(spec, seq_len)  # budget.fit not solved yet: compile the solution, and say so
    if solution is not None:
        make_console(stderr=True).print(fit_note(solution, args.spec))
    acc = account(spec, seq_len=seq_len)
    violations = check(acc.totals, spec.budget)
    if args.emit == "torch":
        return _emit_torch(spec, args)
    if args.emit == "json":
        text = report_text.dumps(report_text.account_json(acc, violations))
    elif args.emit == "dot":
        text = report_text.account_dot(acc)
    else:
        text = None
    if text is not None:
        if args.output:
            try:
                write_atomic(Path(args.output), text + "\n")
            except OSError as err:
                raise output_error(err, args.output, "-o") from None
        else:
            print(text)
        return EXIT_BUDGET if violations else EXIT_OK
    console = make_console() if not args.output else _text_console()
    if not args.quiet:
        print_whole(console, report_text.account_table(acc, violations))
    _print_verdict(console, spec, violations)
    if args.output:  # the same table, as plain text
        try:
            write_atomic(Path(args.output), console.file.getvalue())
        except OSError as err:
            raise output_error(err, args.output, "-o") from None
    return EXIT_BUDGET if violations else EXIT_OK


def _text_console():
    """A console that renders into a string, without colors: the summary written by -o."""
    import io

    from rich.console import Console

    # wide enough that no cell is cut short: a file has no terminal width to fit
    return Console(file=io.StringIO(), width=1000, highlight=False, color_system=None, force_terminal=False)


def _emit_torch(spec, args) -> int:
    if not args.output:
        raise MadslError(
            "--emit torch writes a model folder", hint="add -o FOLDER (model.safetensors and config.json go into it)"
        )
    from madsl.compiler import compile_spec, save

    vocab = args.vocab or spec.vocab
    if vocab is None:
        raise MadslError("--emit torch needs a vocabulary size", hint="add --vocab V or `vocab:` to the spec")
    model = compile_spec(spec, vocab_size=vocab, max_seq_len=args.seq_len or spec.seq_len)
    try:
        save(model, args.output, option="-o")
    except OSError as err:
        raise output_error(err, args.output, "-o") from None
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output}: {spec.name}, {params:,} parameters")
    return EXIT_OK


def _print_verdict(console, spec, violations) -> None:
    if not spec.budget:
        console.print("[dim]no budget declared[/]")
        return
    if violations:
        for v in violations:
            console.print(f"[bold red]✗ budget violated:[/] {v.message()}")
    else:
        console.print("[bold green]✓ within budget:[/] " + ", ".join(f"{q} {b.text}" for q, b in spec.budget.items()))


def cmd_expand(args) -> int:
    from madsl.lang import topology as topo
    from madsl.plan_layout import plan_structure
    from madsl.structure import plan_blocks

    try:
        parsed = topo.parse(args.topology)
    except topo.TopologySyntaxError as err:
        raise topo.locate(err, err.span, args.topology) from None
    if args.format == "json":  # the blocks of its plan's structure, each the list of its layers as written
        blocks = plan_blocks(plan_structure(parsed))
        print(
            json.dumps(
                [
                    [topo.layer_text(node["layer"]) for node in (*b.mixers, b.channel) if node is not None]
                    for b in blocks
                ]
            )
        )
    else:
        print(topo.expanded_text(parsed))
    return EXIT_OK
