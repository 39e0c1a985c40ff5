"""Accounting of the long-convolution filters of the Hyena family (`filter=` of `H`, `mH`, `He`).

A Hyena-type operator convolves `channels` signals with long causal filters (one
per channel: depthwise, "SISO"). How the filter is parametrized decides its
parameters, and whether the operator has a finite recurrent state (fixed state)
or must keep its past inputs (dynamic state, reported as kv_cache). The seven
families are those of the Hyena paper's "long convolution comparisons" (App. A.1)
plus the modal form of the MAD paper. Per channel, with n = filter_states,
w = filter_order, K = filter_size, m = filter_modes, M = filter_length (a reference
length: fno's resolution, rational's truncation length, the time scale of the MLP
filters; set it to the sequence length, or write `seq_len` to have it follow the length
the layer is built for, as the MAD reference builds its Hyena filters with its
`max_length`: resolved by `Primitive.at_length`, which the plan applies at its seq_len):

| kind       | parameters per channel (+ shared)            | fixed state      | dynamic state     |
|------------|----------------------------------------------|------------------|-------------------|
| `modal`    | 4n                                           | n (complex)      | 0                 |
| `s4d`      | 4n + 2                                       | n (complex)      | 0                 |
| `rational` | 2n + 1                                       | n                | 0                 |
| `conv1d`   | K                                            | K - 1            | 0                 |
| `fno`      | 2m                                           | 0                | min(L, M - 1)     |
| `ckconv`   | 1 (+ MLP 1 -> w -> w -> w, no window)        | 0                | L                 |
| `hyena`    | 1 (+ MLP e -> w -> w -> w, sine freqs, M e)  | 0                | L                 |

- `modal`: h[t] = Re(sum_n R_n lambda_n^t), filter_states complex modes per channel,
  four reals per mode (log-rate, angle, Re R, Im R) ("Laughing Hyena", Massaroli et al.
  2023; MAD paper App. B.3.2). A diagonal SSM: state = filter_states complex numbers.
- `s4d`: the diagonal SSM of S4D (Gu et al. 2022) as H3 uses it: per mode a continuous
  pole A_n (log of -Re A, Im A) and an output coefficient C_n (complex), per channel a
  step log(dt) and a skip D; zero-order-hold discretisation with B = 1. filter_states
  counts complex modes (conjugate pairs), so S4D's "state size N = 64" is filter_states
  = 32. State = filter_states complex numbers per channel, as for `modal`.
- `rational`: a transfer function of order n, H(z) = h0 + b(z)/a(z), b and a of degree n
  (a monic, b strictly proper: n coefficients each) and h0 a skip term: 2n + 1 per
  channel (the Hyena paper's TransferFunc; RTF, Parnichkun et al. 2024; a through its
  reflection coefficients, so it is stable). Parallel form: b/a evaluated by FFT at the
  M-th roots of unity (M = filter_length, RTF's truncation length; past M the same
  recurrence continues).
  Its companion (direct form II) realisation keeps the last n values of the recursion
  w = u / a: state = n real numbers per channel.
- `conv1d`: explicit taps, K per channel, zero beyond K (Hyena App. A: K = 64). A FIR of
  K taps is a state-space system whose state is its last K - 1 inputs: counted as
  fixed state, because K is a length-independent design choice (64 << L) and that
  window is all the operator remembers; reporting it as convolution state would make
  the conv1d operator look stateless in iso-state comparisons.
- `fno`: explicit in frequency (Li et al. 2020): m complex weights per channel (2m
  reals; the imaginary part of the DC weight has no effect but is a parameter, as in
  FNO) on the lowest m frequencies of a spectrum of resolution M, zero elsewhere; the
  filter is the length-M impulse response of that spectrum, zero beyond M. M is set to
  the sequence length (as safari's l_max / RTF's truncation length), so the filter
  spans the sequence and step mode keeps past inputs: dynamic state channels *
  min(L, M - 1) (it stops growing at M - 1 if the sequence outgrows the filter).
- `ckconv`: continuous kernel (Romero et al. 2021): a SIREN-style MLP of the time
  coordinate alone, 1 -> w -> w -> w -> channels with sine activations and biases
  everywhere, no window, no skip. No finite state: dynamic state channels * L.
- `hyena`: the implicit MLP filter of the Hyena paper (App. A): positional features
  (filter_emb_dim), MLP e -> w -> w -> w -> channels (no bias on the last layer), one
  learned sine frequency per hidden unit shared by all activations, a skip per channel,
  an exponential-decay window (fixed). Dynamic state channels * L. The positional features
  are fixed unless `filter_emb_learned`: then the first M of them are parameters (M x e,
  shared by all channels, initialised to the fixed features), as the MAD reference's
  `PositionalEmbedding` registers them; past M the fixed features continue.

Featurization FLOPs (the "S * D" per token of MAD paper App. C.4.2): S = filter_states
for the state-space filters (each tap is a sum or recursion over the states), S =
filter_order for the MLP filters, 0 for conv1d (the taps are the parameters); fno pays
one inverse real FFT of size M per channel and sequence, 2.5 * M * log2(M).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from .base import SEQ_LEN, ConfigError, Primitive, SeqLen

FilterKind = Literal["modal", "s4d", "rational", "conv1d", "fno", "ckconv", "hyena"]


@dataclass(frozen=True)
class LongFilterPrimitive(Primitive):
    """The hyperparameters every Hyena-family primitive shares: its short explicit filter,
    the long filter's family and that family's sizes (the table above), and the bias of
    the projections. Subclasses add their own fields after these."""

    short_filter: int
    filter: FilterKind
    filter_states: int
    filter_order: int
    filter_emb_dim: int
    filter_size: int
    filter_modes: int
    filter_length: int | SeqLen  # `seq_len`: the length the layer is built for (base.SEQ_LEN)
    filter_emb_learned: bool
    bias: bool


FILTERS = ("modal", "s4d", "rational", "conv1d", "fno", "ckconv", "hyena")

# The hyperparameters of the Hyena-family primitives that size the long filter (positive integers),
# and all those that configure it (filter_config).
FILTER_FIELDS = ("filter_states", "filter_order", "filter_emb_dim", "filter_size", "filter_modes", "filter_length")
FILTER_OPTIONS = FILTER_FIELDS + ("filter_emb_learned",)


@dataclass(frozen=True)
class FilterCost:
    params: int
    fixed_state: int  # recurrent state per sequence (0 for filters without one)
    dynamic_per_token: int  # numbers kept per past token (0 for recurrent filters)
    featurization_flops_per_token: int  # "S_hyena * D" of MAD paper App. C.4.2
    dynamic_cap: int | None = None  # past tokens after which the dynamic state stops growing (fno)
    featurization_flops_per_sequence: int = 0  # independent of L (fno's inverse FFT)

    def dynamic_state(self, seq_len: int) -> int:
        """Numbers kept for the past at sequence length seq_len (the kv_cache of the layer)."""
        tokens = seq_len if self.dynamic_cap is None else min(seq_len, self.dynamic_cap)
        return self.dynamic_per_token * tokens

    def featurization_flops(self, seq_len: int) -> int:
        return self.featurization_flops_per_token * seq_len + self.featurization_flops_per_sequence


def _mlp(inputs: int, width: int, outputs: int, out_bias: bool) -> int:
    """Linear(inputs, w), 2 x Linear(w, w), Linear(w, outputs): the depth-4 filter MLP of
    Hyena App. A (Table A.4, "filter FFN depth 4")."""
    return (inputs * width + width) + 2 * (width * width + width) + width * outputs + (outputs if out_bias else 0)


def _modal(channels: int, n: int) -> FilterCost:
    return FilterCost(
        params=4 * channels * n,
        fixed_state=channels * n,
        dynamic_per_token=0,
        featurization_flops_per_token=n * channels,
    )


def _s4d(channels: int, n: int) -> FilterCost:
    # per mode: log(-Re A), Im A, Re C, Im C; per channel: log dt and the skip D
    return FilterCost(
        params=channels * (4 * n + 2),
        fixed_state=channels * n,
        dynamic_per_token=0,
        featurization_flops_per_token=n * channels,
    )


def _rational(channels: int, n: int) -> FilterCost:
    # denominator (n, through its reflection coefficients), numerator (n), skip h0
    return FilterCost(
        params=channels * (2 * n + 1),
        fixed_state=channels * n,
        dynamic_per_token=0,
        featurization_flops_per_token=n * channels,
    )


def _conv1d(channels: int, taps: int) -> FilterCost:
    return FilterCost(
        params=channels * taps, fixed_state=channels * (taps - 1), dynamic_per_token=0, featurization_flops_per_token=0
    )


def _fno(channels: int, modes: int, length: int) -> FilterCost:
    inverse_fft = round(2.5 * length * math.log2(max(length, 2))) * channels
    return FilterCost(
        params=2 * channels * modes,
        fixed_state=0,
        dynamic_per_token=channels,
        featurization_flops_per_token=0,
        dynamic_cap=length - 1,
        featurization_flops_per_sequence=inverse_fft,
    )


def _ckconv(channels: int, width: int) -> FilterCost:
    return FilterCost(
        params=_mlp(1, width, channels, out_bias=True),
        fixed_state=0,
        dynamic_per_token=channels,
        featurization_flops_per_token=width * channels,
    )


def _hyena(channels: int, width: int, emb: int, length: int, emb_learned: bool) -> FilterCost:
    sine_freq, skip = width, channels  # one learned frequency per hidden unit; a skip per channel
    features = length * emb if emb_learned else 0  # the positional features as parameters (MAD reference)
    return FilterCost(
        params=_mlp(emb, width, channels, out_bias=False) + sine_freq + skip + features,
        fixed_state=0,
        dynamic_per_token=channels,
        featurization_flops_per_token=width * channels,
    )


# Each family's cost function and the filter sizes it reads, in order.
_FILTER_COSTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "modal": (_modal, ("filter_states",)),
    "s4d": (_s4d, ("filter_states",)),
    "rational": (_rational, ("filter_states",)),
    "conv1d": (_conv1d, ("filter_size",)),
    "fno": (_fno, ("filter_modes", "filter_length")),
    "ckconv": (_ckconv, ("filter_order",)),
    "hyena": (_hyena, ("filter_order", "filter_emb_dim", "filter_length", "filter_emb_learned")),
}


def filter_cost(kind: str, channels: int, **sizes: int | None) -> FilterCost:
    """Parameters, state and featurization FLOPs of `channels` long filters of the given kind.
    Only the sizes the kind uses (FILTER_OPTIONS) need to be given."""
    if kind not in _FILTER_COSTS:
        raise ValueError(f"unknown filter {kind!r} (expected one of {', '.join(FILTERS)})")
    cost, needs = _FILTER_COSTS[kind]
    missing = [name for name in needs if sizes.get(name) is None]
    if missing:
        raise ValueError(f"filter {kind!r} needs {missing[0]}")
    return cost(channels, *(sizes[name] for name in needs))


def filter_config(prim: Any) -> dict[str, int | bool]:
    """The filter hyperparameters of a Hyena-family primitive, as keyword arguments."""
    return {name: getattr(prim, name) for name in FILTER_OPTIONS}


def validate_filter(prim: Any) -> None:
    """Range checks of a Hyena-family primitive's filter hyperparameters (ConfigError). A
    filter_length of `seq_len` is checked once resolved (`Primitive.at_length`)."""
    for key in FILTER_FIELDS:
        value = getattr(prim, key)
        if value != SEQ_LEN and value <= 0:
            raise ConfigError(key, f"{prim.name}: {key} must be positive, got {value}")
    kind = prim.filter
    if prim.filter_emb_learned and kind != "hyena":
        raise ConfigError(
            "filter_emb_learned",
            f"{prim.name}: filter_emb_learned applies to filter=hyena only "
            f"(the implicit filter's positional features), not filter={kind}",
            "set filter: hyena, or leave filter_emb_learned false",
        )
    if kind == "hyena" and (prim.filter_emb_dim < 3 or prim.filter_emb_dim % 2 == 0):
        raise ConfigError(
            "filter_emb_dim", f"{prim.name}: filter_emb_dim must be odd and >= 3 (time plus sine/cosine pairs)"
        )
    length = prim.filter_length
    if length == SEQ_LEN:  # the checks below read the number: made at the length the layer is built for
        return
    if kind in ("hyena", "ckconv", "fno") and length < 2:
        raise ConfigError(
            "filter_length", f"{prim.name}: filter_length must be at least 2 for filter={kind}, got {length}"
        )
    if kind == "rational" and length <= prim.filter_states:
        raise ConfigError(
            "filter_length",
            f"{prim.name}: filter_length={length} must exceed the "
            f"order filter_states={prim.filter_states} (the rational filter's "
            "truncation length)",
        )
    if kind == "fno" and prim.filter_modes > length // 2 + 1:
        raise ConfigError(
            "filter_modes",
            f"{prim.name}: filter_modes={prim.filter_modes} exceeds the {length // 2 + 1} "
            f"frequencies of a spectrum of resolution filter_length={length}",
            f"use filter_modes <= {length // 2 + 1} or a longer filter_length",
        )
