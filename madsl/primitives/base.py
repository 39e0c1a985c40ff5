"""The accounting side of a layer primitive: its hyperparameters, and its exact
parameter count, fixed (recurrent) state, convolution state, dynamic state (KV
cache) and FLOPs, computed analytically.

This module and the primitives built on it never import torch: `madsl check`,
`madsl expand` and the accounting of `madsl compile` must start in a fraction of
a second. The torch side of each primitive lives in `madsl/layers/<name>.py`
and is imported only by `Primitive.build()`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Role = Literal["sequence", "channel", "both"]


class ConfigError(ValueError):
    """A hyperparameter of a primitive is missing, unknown, of the wrong type or out of range."""

    def __init__(self, key: str | None, message: str, hint: str | None = None):
        super().__init__(message)
        self.key = key
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class WidthRelative:
    """A default stated relative to the model width (stdlib: `4 * dim`, `dim / 16`): the paper
    gives these sizes at width 128, as multiples of it (SwiGLU's inner 512, mA's head width 8),
    so a model of another width scales them. Resolved to an integer where the width is known
    (`Primitive.create`, a spec's identity), so every report shows the number."""

    multiplier: int = 1
    divisor: int = 1

    @classmethod
    def parse(cls, text: str) -> "WidthRelative | None":
        """`K * dim` or `dim / K` (K a positive integer), else None."""
        import re

        if match := re.fullmatch(r"\s*(\d+)\s*\*\s*dim\s*", text):
            return cls(multiplier=int(match[1]))
        if match := re.fullmatch(r"\s*dim\s*/\s*(\d+)\s*", text):
            return cls(divisor=int(match[1]))
        return None

    def resolve(self, key: str, dim: int) -> int:
        value, remainder = divmod(self.multiplier * dim, self.divisor)
        if remainder or value < 1:
            raise ConfigError(
                key,
                f"{key} defaults to {self} (the paper's size at width 128, scaled), "
                f"which is not a whole number at width {dim}",
                f"set {key} explicitly, or use a width divisible by {self.divisor}",
            )
        return value

    def __str__(self) -> str:
        return f"{self.multiplier} * dim" if self.divisor == 1 else f"dim / {self.divisor}"


def resolve_width_relative(params: dict[str, Any], dim: int) -> dict[str, Any]:
    """`params` with every width-relative default replaced by its value at width `dim`."""
    return {k: v.resolve(k, dim) if isinstance(v, WidthRelative) else v for k, v in params.items()}


# A length-relative value: the word `seq_len` for an integer hyperparameter whose field admits it
# (annotated `int | SeqLen`, e.g. the Hyena filters' filter_length) stands for the sequence length
# the layer is built for, as the MAD reference sizes its Hyena filters by `max_length`. A primitive
# holding it is resolved by `Primitive.at_length(L)`: the plan does so at the length it is built
# for (`madsl.graph.build_graph(spec, seq_len=L)`: the accounting's seq_len, `madsl.compile`'s
# max_seq_len), so that the accounting and the module read one number. A spec's identity keeps the
# word, and a run's identity holds its task setting's length.
SEQ_LEN = "seq_len"
SeqLen = Literal["seq_len"]


@dataclass(frozen=True)
class Cost:
    """What one layer instance costs. All counts are per sequence (batch of one)."""

    params: int
    active_params: int  # the parameters one token's output reads (a routed layer's: its chosen experts')
    fixed_state: int  # recurrent state carried between tokens, independent of length
    conv_state: int  # short-convolution buffers (reported apart from fixed_state, as the paper does)
    kv_cache: int  # dynamic state at the given sequence length (attention's KV cache)
    flops: int  # forward FLOPs for one sequence of the given length


@functools.lru_cache(maxsize=None)
def _fields_of(cls: type) -> dict[str, Any]:
    """A primitive class's hyperparameters and their types: `typing.get_type_hints` resolves every
    annotation on each call, and a plan of thousands of runs asks for them per layer."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "dim"}


@dataclass(frozen=True)
class Primitive:
    """Base class. Subclasses are frozen dataclasses whose fields are the primitive's
    hyperparameters; `dim` (the model width) is always the first field. Their
    default values are data: they come from `stdlib/`, with their provenance."""

    dim: int

    name: ClassVar[str]
    role: ClassVar[Role]
    # "module.path:ClassName" of the torch module; imported lazily by build().
    module: ClassVar[str]
    # Hyperparameters added after run identities were first stored: a spec's identity leaves
    # them out while they are at their stdlib default, so that stored runs keep their ids.
    identity_omits: ClassVar[tuple[str, ...]] = ()

    # --- construction and validation -------------------------------------------------
    @classmethod
    def fields(cls) -> dict[str, Any]:
        """Hyperparameter name -> annotated type (without `dim`); a copy, the class's own is cached."""
        return dict(_fields_of(cls))

    @classmethod
    def create(cls, dim: int, config: dict[str, Any]) -> "Primitive":
        """Check names and types of `config`, then build and validate the primitive."""
        fields = cls.fields()
        for key in config:
            if key not in fields:
                import difflib

                close = difflib.get_close_matches(key, list(fields), n=1)
                raise ConfigError(
                    key,
                    f"{cls.name} has no parameter {key!r}",
                    f"did you mean {close[0]!r}?" if close else f"parameters of {cls.name}: {', '.join(fields)}",
                )
        missing = [k for k in fields if k not in config]
        if missing:
            raise ConfigError(missing[0], f"{cls.name} needs a value for {missing[0]!r}")
        config = resolve_width_relative(config, dim)
        values = {key: _coerce(cls.name, key, fields[key], value) for key, value in config.items()}
        prim = cls(dim=dim, **values)
        prim.validate()
        return prim

    def validate(self) -> None:
        """Range checks beyond types; raise ConfigError(key, message, hint)."""

    def config(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "dim"}

    def length_relative(self) -> tuple[str, ...]:
        """The hyperparameters that hold `seq_len` (resolved by `at_length`)."""
        # read past any __getattribute__ of a subclass: this check is no use of the value by a
        # module (tests/test_contract.py records which fields a module's constructor reads)
        return tuple(name for name in _length_fields(type(self)) if object.__getattribute__(self, name) == SEQ_LEN)

    def at_length(self, seq_len: int) -> "Primitive":
        """This primitive as built for sequences of `seq_len` tokens: every hyperparameter written
        `seq_len` set to that number, validated (ConfigError); itself where there is none."""
        names = self.length_relative()
        if not names:
            return self
        prim = dataclasses.replace(self, **{name: seq_len for name in names})
        prim.validate()
        return prim

    def _resolved(self) -> None:
        names = self.length_relative()
        if names:
            raise ConfigError(
                names[0],
                f"{self.name}: {names[0]} is seq_len, the length the layer is built "
                "for: resolve it first (Primitive.at_length(L); the plan and "
                "madsl.compile do so at their sequence length)",
            )

    def derived(self) -> dict[str, Any]:
        """The sizes derived from the hyperparameters (the class's properties: e.g. attention's
        inner_head_dim where head_dim is null), so that reports show every resolved value."""
        out = {}
        for name in sorted(dir(type(self))):
            if isinstance(getattr(type(self), name, None), property) and not name.startswith("_"):
                value = getattr(self, name)
                if isinstance(value, (bool, int, float, str)):
                    out[name] = value
        return out

    # --- accounting -----------------------------------------------------------------
    def params(self) -> int:
        raise NotImplementedError

    def active_params(self) -> int:
        """The parameters one token's output reads: `params()`, except where a router picks a
        few experts per token (MoE, Hyena experts), which override it to count the router, what
        every token reads (shared experts, projections) and the chosen experts alone: the
        "A3B" of a "30B-A3B" model. tests/test_contract.py measures it from the module's
        gradients: what one token's output reads lies between that count and `params()`."""
        return self.params()

    def per_use_params(self) -> int:
        """The parameters each further use of a tagged layer adds: a shared layer's per-use parts
        (Zamba2's adapters and output projection); 0: a tag shares the whole layer."""
        return 0

    def fixed_state(self) -> int:
        return 0

    def conv_state(self) -> int:
        return 0

    def kv_cache(self, seq_len: int) -> int:
        return 0

    def flops(self, seq_len: int) -> int:
        raise NotImplementedError

    def non_matmul_flops(self, seq_len: int) -> int | None:
        """The part of `flops(seq_len)` outside the matmul class: long (FFT) convolutions and the
        filters' featurization, scans and recurrences (counted in their recurrent form), softmax,
        gates and other elementwise terms. The rest, flops - non_matmul_flops, is the matmul
        class: products of activations with weights (projections, routers, experts, low-rank
        maps, the short convolutions' taps) and attention's q.k and p.v products, which
        tests/test_contract.py measures on the module with torch's FLOP counter. Computed from
        the terms `flops` adds, so that the two stay one formula. None: not stated."""
        return None

    def cost(self, seq_len: int) -> Cost:
        self._resolved()
        return Cost(
            params=self.params(),
            active_params=self.active_params(),
            fixed_state=self.fixed_state(),
            conv_state=self.conv_state(),
            kv_cache=self.kv_cache(seq_len),
            flops=self.flops(seq_len),
        )

    # --- torch side -----------------------------------------------------------------
    def build(self):  # -> torch.nn.Module
        self._resolved()
        module_name, _, class_name = self.module.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        return cls(self)


class KeyValueHeads:
    """For primitives with `heads` and an optional `kv_heads` (None: as many as heads): grouped-query
    attention, each key/value head read by heads / kv_heads query heads."""

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def groups(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.heads // self.key_value_heads


class Heads:
    """For primitives with `heads` and an optional `head_dim` (None: dim // heads, which then
    must divide the width): the head width and the total width of the heads."""

    def validate_heads(self) -> None:
        positive(self, "heads", "head_dim")
        if self.head_dim is None:
            divides(self, "heads", self.heads, self.dim, "dim")

    @property
    def inner_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.heads

    @property
    def inner(self) -> int:
        return self.heads * self.inner_head_dim


def positive(prim: Primitive, *keys: str) -> None:
    """Every named hyperparameter is a positive integer."""
    for key in keys:
        value = getattr(prim, key)
        if value is not None and value <= 0:
            raise ConfigError(key, f"{prim.name}: {key} must be positive, got {value}")


def divides(prim: Primitive, key: str, value: int, total: int, what: str) -> None:
    if total % value:
        raise ConfigError(
            key,
            f"{prim.name}: {key}={value} does not divide {what}={total}",
            f"choose {key} among the divisors of {total}: {', '.join(str(d) for d in _divisors(total))}",
        )


def log2(n: int) -> float:
    return math.log2(max(n, 2))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:12]


def _coerce(prim_name: str, key: str, annotation: Any, value: Any) -> Any:
    """Check `value` against the field's annotation (int, float, bool, str, Literal, Optional)."""
    origin = typing.get_origin(annotation)
    options = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in options:
            return None
        non_none = [o for o in options if o is not type(None)]
        errors = []
        for option in non_none:
            try:
                return _coerce(prim_name, key, option, value)
            except ConfigError as err:
                errors.append(err)
        if SeqLen in non_none and int in non_none:  # an integer or the word seq_len
            raise ConfigError(
                key,
                f"{prim_name}: {key} must be an int or {SEQ_LEN} (the length the layer is built for), got {value!r}",
            )
        raise errors[0]
    if origin is Literal:
        if value in options:
            return value
        import difflib

        close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
        raise ConfigError(
            key,
            f"{prim_name}: {key} must be one of {', '.join(map(str, options))}; got {value!r}",
            f"did you mean {close[0]!r}?" if close else None,
        )
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    type_name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(key, f"{prim_name}: {key} must be {_article(type_name)} {type_name}, got {value!r}")


@functools.cache
def _length_fields(cls: type) -> tuple[str, ...]:
    """The fields of a primitive class that admit `seq_len` (annotated `int | SeqLen`)."""
    hints = typing.get_type_hints(cls)
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if any(
            typing.get_origin(o) is Literal and SEQ_LEN in typing.get_args(o) for o in typing.get_args(hints[f.name])
        )
    )


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
