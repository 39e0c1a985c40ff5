"""The schema of a spec's top level and of its `budget:` section.

Every key is checked; unknown keys are errors, never ignored:

    name: str                       required
    description: str
    extends: path                   another spec (see docs/language.md); this one's keys win
    dim: int                        model width, required
    vocab: int                      vocabulary size (embedding and head); optional
    seq_len: int                    length used for KV cache and FLOP accounting (default 128)
    topology: str                   the topology string, required
    channel_mixer: SYMBOL | none    the channel mixer of blocks that name none (default Sg)
    norm: rms | layer               pre-norm kind (default rms)
    tie_embeddings: bool            output head shares the embedding (default true)
    positions: none | learned       learned absolute position embeddings added to the token
                                    embedding, one per position up to seq_len (default none)
    embedding_std: number           init std of the token (and position) embedding (default 0.02)
    linear_std: number | none       init every Linear weight N(0, std), biases zero, as GPT-2 / GPT-Neo
                                    do (default none: each layer's own initialisation)
    final_norm: bool                a norm after the last block, before the head (default true)
    embedding_norm: bool            a norm of the token embedding before the first block (default false;
                                    RWKV's ln0: flash-linear-attention's RWKV-7 layer-0 pre_norm)
    meta_tokens: int                learned tokens prepended to every sequence, their outputs dropped
                                    (default 0; Hymba's meta tokens, num_memory_tokens)
    norm_eps: number                the epsilon of the pre-norms and the final norm (default 1e-5)
    embedding_scale: number         the token embedding times this (default 1; Granite's embedding_multiplier)
    residual_scale: number          each block part's output times this before its residual add (default 1)
    postnorm: bool                  each block part's residual is its normed input, not the stream before
                                    its pre-norm (default false; MiniMax's layers)
    residual_factors: {SYMBOL: {alpha, beta}}   a block part whose layer is SYMBOL joins the stream as
                                    alpha * residual + beta * output (default 1 and 1; MiniMax's factors)
    logit_divisor: number           the logits divided by this (default 1; Granite's logits_scaling)
    logit_soft_cap: number | none   the logits through cap * tanh(logits / cap) (default none; xLSTM's)
    init: [{from, layers, freeze}]  layers that start from a saved model's weights (init.py)
    layers: {SYMBOL: {...}}         override a symbol's parameters, or define a new symbol
                                    with `primitive: NAME` or `base: SYMBOL` (symbols.py)
    budget: {QUANTITY: BOUND, seq_len: int}   see madsl/lang/budget.py
    eval: {...}                     settings for `madsl eval` (checked by the runner)
"""

from __future__ import annotations

import difflib
from typing import Any

from madsl.errors import Collector, MadslError, did_you_mean
from madsl.lang import budget as budgets
from madsl.lang.spec.files import SPEC_KEYS, Locator

TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "extends": (str,),
    "dim": (int,),
    "vocab": (int,),
    "seq_len": (int,),
    "topology": (str,),
    "channel_mixer": (str, type(None)),
    "norm": (str,),
    "tie_embeddings": (bool,),
    "positions": (str,),
    "embedding_std": (float, int),
    "linear_std": (float, int, type(None)),
    "final_norm": (bool,),
    "embedding_norm": (bool,),
    "meta_tokens": (int,),
    "norm_eps": (float, int),
    "embedding_scale": (float, int),
    "residual_scale": (float, int),
    "postnorm": (bool,),
    "residual_factors": (dict,),
    "logit_divisor": (float, int),
    "logit_soft_cap": (float, int, type(None)),
    "init": (list,),
    "layers": (dict,),
    "budget": (dict,),
    "eval": (dict,),
}
assert tuple(TYPES) == SPEC_KEYS, "madsl.lang.spec.files.SPEC_KEYS names the keys of TYPES"
REQUIRED = ("name", "dim", "topology")
MAX_META_TOKENS = 65_536  # prepended to every sequence: more than any published model's (Hymba: 128)
CHOICES = {"norm": ("rms", "layer"), "positions": ("none", "learned")}
POSITIVE = (
    *("dim", "vocab", "seq_len", "embedding_std", "linear_std", "norm_eps"),
    *("embedding_scale", "residual_scale", "logit_divisor", "logit_soft_cap"),
)
_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "true or false",
    dict: "a mapping",
    type(None): "none",
    float: "a number",
    list: "a list",
}


def check_top_level(data: dict[str, Any], at: Locator, errors: Collector, *, from_file: bool) -> set[str]:
    """Keys known, required keys present, every value of its type and range. Each problem goes
    to `errors`; returns the keys whose values cannot be used (missing, or of the wrong type or range)."""
    unusable: set[str] = set()

    def error(key: str, err: MadslError) -> None:
        errors.add(err)
        unusable.add(key)

    misspelled: set[str] = set()  # known keys that an unknown key is near: 'topolgy' is 'topology'
    for key in data:
        if key not in TYPES:
            error(
                key,
                MadslError(
                    f"unknown key {key!r}",
                    at.key(key),
                    expected="one of " + ", ".join(TYPES),
                    hint=did_you_mean(str(key), TYPES),
                ),
            )
            misspelled |= set(difflib.get_close_matches(str(key), TYPES, n=1, cutoff=0.5))
    for key in REQUIRED:
        if key not in data:
            unusable.add(key)
            if key in misspelled:  # the unknown key's error already says what to write
                continue
            error(
                key,
                MadslError(
                    f"missing required key {key!r}",
                    at.key(),
                    hint=f"add `{key}: ...` to the spec" + (" (or to the spec it extends)" if from_file else ""),
                ),
            )
    for key, value in data.items():
        problem = _value_problem(key, value, at) if key in TYPES else None
        if problem is not None:
            error(key, problem)
    return unusable


def _value_problem(key: str, value: Any, at: Locator) -> MadslError | None:
    """What is wrong with a known key's value: its type, its choice or its range (None: nothing)."""
    allowed = TYPES[key]
    # YAML's true/false are Python bools, and bool is an int: an integer key must not take them
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        hint = None
        if key == "topology" and isinstance(value, (list, dict)):
            hint = "YAML reads [...] and {...} as lists and mappings: quote the topology, e.g. topology: '[H | mA]'"
        return MadslError(
            f"{key} must be {' or '.join(_TYPE_NAMES[t] for t in allowed)}, got {value!r}",
            at.value(key),
            hint=hint,
        )
    if key in CHOICES and value not in CHOICES[key]:
        return MadslError(
            f"{key} must be one of {', '.join(CHOICES[key])}, got {value!r}",
            at.value(key),
            hint=did_you_mean(str(value), CHOICES[key]),
        )
    if key in POSITIVE and value is not None and not 0 < value < float("inf"):
        kind = "integer" if float not in TYPES[key] else "number"
        return MadslError(f"{key} must be a positive {kind}, got {value}", at.value(key))
    if key == "meta_tokens" and not 0 <= value <= MAX_META_TOKENS:
        return MadslError(f"meta_tokens must be an integer from 0 to {MAX_META_TOKENS:,}, got {value}", at.value(key))
    if key == "name" and not value.strip():
        return MadslError("name must not be empty", at.value("name"))
    return None


def parse_budget(
    section: dict[str, Any], at: Locator, errors: Collector
) -> tuple[dict[str, budgets.Bound], int | None, list[str]]:
    """The `budget:` section -> bounds by quantity, the sequence length they are checked at,
    and the free parameters (`fit: [H.filter_states]`) that `madsl fit` may set to meet them.
    Each key is checked on its own; a bad one goes to `errors` and is left out."""
    bounds: dict[str, budgets.Bound] = {}
    seq_len = None
    fit: list[str] = []
    for key, value in section.items():
        with errors.check():
            if key == "fit":
                fit = _fit_items(value, at)
            elif key == "seq_len":
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise MadslError(
                        f"budget.seq_len must be a positive integer, got {value!r}", at.value("budget", key)
                    )
                seq_len = value
            elif key not in budgets.QUANTITIES:
                raise MadslError(
                    f"unknown budget {key!r}",
                    at.key("budget", key),
                    expected="one of " + ", ".join(budgets.QUANTITIES + ("seq_len", "fit")),
                    hint=did_you_mean(str(key), budgets.QUANTITIES + ("fit",)),
                )
            else:
                try:
                    bounds[key] = budgets.parse_bound(value)
                except budgets.BudgetError as err:
                    raise MadslError(f"budget.{key}: {err}", at.value("budget", key)) from None
    if "fit" in section and not any(q in section for q in budgets.QUANTITIES):
        errors.add(
            MadslError(
                "budget.fit needs a budget to fit to",
                at.key("budget", "fit"),
                hint="add a bound such as fixed_state: 4096 next to fit:",
            )
        )
    return bounds, seq_len, fit


def _fit_items(value: Any, at: Locator) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise MadslError(
            f"budget.fit must list free parameters, got {value!r}",
            at.value("budget", "fit"),
            expected="SYMBOL.param names such as [H.filter_states]",
        )
    return list(items)
