"""Megatron-LM / Nemotron-H hybrid layer patterns <-> madsl topologies (`madsl convert`).

Megatron-LM's hybrid models (and Nemotron-H's Hugging Face configs, key
`hybrid_override_pattern`) describe the stack as one character per layer, each a pre-norm
residual unit:

    M   a Mamba layer (Mamba-2 in Megatron-LM and Nemotron-H)  -> madsl M2 (or Mb: mamba=...)
    *   a self-attention layer                                  -> madsl A
    -   an MLP layer                                            -> madsl Mlp
    E   a mixture-of-experts MLP layer                          -> madsl MoE

A madsl block is a sequence mixer followed by its channel mixer, each a pre-norm residual
unit: exactly two consecutive Megatron layers. So `M-` is the block `M2-Mlp`, a sequence
layer not followed by an MLP is `M2-none`, and an MLP with no sequence layer before it
cannot be written as a madsl block (an error names its position). The other direction reads
the spec's plan, which must be a plain stack: no groups, parallel mixers, shared tags or
per-layer overrides (`madsl.structure` refuses each with the reason).

What the accounting then counts is madsl's layers at the spec's parameters (`layers:`, from
`madsl convert --layer`): a pattern carries no sizes, so Nemotron-H's squared ReLU
(`Mlp.activation=relu2`), grouped-query attention (`A.kv_heads`) and Mamba-2 width
(`M2.heads`, where it is not expand x dim) are given there; the command refuses a pattern
given Mamba-2 sizes without their width (madsl/cli/convert.py).
"""

from __future__ import annotations

import unicodedata
from typing import Any

from madsl.errors import Location, MadslError
from madsl.lang import topology as topo

SEQUENCE = {"M": "mamba", "*": "attention"}
CHANNEL = {"-": "mlp", "E": "moe"}
DEFAULT_SYMBOLS = {"mamba": "M2", "attention": "A", "mlp": "Mlp", "moe": "MoE"}
# madsl primitives -> the pattern character (the reverse direction)
PRIMITIVE_CHARACTER = {"mamba": "M", "mamba2": "M", "attention": "*", "mlp": "-", "swiglu": "-", "moe": "E"}


def _error(pattern: str, index: int, message: str, hint: str | None = None) -> MadslError:
    return MadslError(
        message,
        Location(None, 1, index + 1, pattern, 1),
        hint=hint,
        expected="M (Mamba), * (attention), - (MLP), E (MoE)",
    )


def describe_character(char: str) -> str:
    """A character as errors name it: past ASCII with its code point and name, so that a look-alike
    letter shows as what it is: 'М' (U+041C CYRILLIC CAPITAL LETTER EM)."""
    if char.isascii():
        return repr(char)
    name = unicodedata.name(char, "")
    return f"{char!r} (U+{ord(char):04X}{' ' + name if name else ''})"


def from_megatron_pattern(pattern: str, symbols: dict[str, str] | None = None) -> str:
    """A Megatron `hybrid_override_pattern` as a madsl topology (consecutive equal blocks
    counted: `M-M-M-` -> `3M2-Mlp`). `symbols` maps mamba/attention/mlp/moe to madsl symbols."""
    return _run_length(megatron_blocks(pattern, symbols))


def megatron_blocks(pattern: str, symbols: dict[str, str] | None = None) -> list[str]:
    """The madsl blocks of a Megatron pattern, one per sequence layer (`M-` -> `M2-Mlp`)."""
    names = {**DEFAULT_SYMBOLS, **(symbols or {})}
    if not pattern:
        raise MadslError("an empty hybrid pattern", hint="e.g. M-M-M*-")
    blocks: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char in SEQUENCE:
            mixer = names[SEQUENCE[char]]
            if i + 1 < len(pattern) and pattern[i + 1] in CHANNEL:
                blocks.append(f"{mixer}-{names[CHANNEL[pattern[i + 1]]]}")
                i += 2
            else:
                blocks.append(f"{mixer}-{topo.NO_CHANNEL}")
                i += 1
        elif char in CHANNEL:
            raise _error(
                pattern,
                i,
                f"layer {i + 1} ({char!r}) is an MLP with no Mamba or attention layer "
                "before it; a madsl block is a sequence mixer and then its channel mixer",
                hint="madsl can express an MLP only right after a sequence layer (M- or *-)",
            )
        else:
            raise _error(pattern, i, f"unknown layer character {describe_character(char)} at position {i + 1}")
    return blocks


def compact(blocks: list[str]) -> str:
    """A topology for a list of blocks: their shortest repeating period as `(...)xN` (Jamba's
    8-layer period: `(Mb-Sg:Mb-MoE:...)x4`), each period run-length counted."""
    n = len(blocks)
    period = next(p for p in range(1, n + 1) if n % p == 0 and all(blocks[i] == blocks[i % p] for i in range(n)))
    if period in (1, n):
        return _run_length(blocks)
    return f"({_run_length(blocks[:period])})x{n // period}"


def _run_length(blocks: list[str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(blocks):
        j = i
        while j < len(blocks) and blocks[j] == blocks[i]:
            j += 1
        out.append(blocks[i] if j - i == 1 else f"{j - i}{blocks[i]}")
        i = j
    return ":".join(out)


def to_megatron_pattern(spec: Any) -> str:
    """The `hybrid_override_pattern` of a spec (a Spec or a path) whose plan Megatron can
    express: a plain stack (`madsl.structure`) of Mamba / Mamba-2 / attention sequence mixers
    and MLP / SwiGLU / MoE channel mixers."""
    from madsl.graph import build_graph
    from madsl.lang.spec import Spec, load_spec
    from madsl.structure import plan_blocks, refuse_beyond_stack

    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    plan = build_graph(spec)
    refuse_beyond_stack(plan, "Megatron pattern")
    out = []
    for block in plan_blocks(plan):
        for node in (*block.mixers, block.channel):
            if node is None:
                continue
            primitive = node["primitive"].name
            if primitive not in PRIMITIVE_CHARACTER:
                raise MadslError(
                    f"{spec.name}: {node['layer'].symbol} ({primitive}) has no Megatron layer character",
                    expected="mamba, mamba2, attention, mlp, swiglu or moe layers",
                )
            out.append(PRIMITIVE_CHARACTER[primitive])
    return "".join(out)
