"""Long filters of the Hyena family as modules: `filter(L)` -> h of shape (channels, L).

Accounting (parameter counts, states) and the choice of each family's state:
`madsl.primitives.filters`. Every filter exposes the same small interface to the
layers that use them (Hyena, multi-head Hyena, Hyena experts):

    forward(seq_len) -> h (channels, L)           the filter's taps, for the parallel form
    skip                                          per-channel skip ("D") term or None
    channel_keys                                  state entries whose axis 1 is the filter channel
    init_state(batch, device, dtype, extra=())    the filter's part of the layer state
    step(u_t (B, c, *extra), state part, channels, taps=None) -> (y_t, new state part)

`channels` in `step` is a slice of the filter's channels: an order-N Hyena runs its
N-1 channel groups one after another, with a gate in between. `extra` are trailing
dims that share a channel's filter (multi-head Hyena: the head_dim x head_dim outer
product of a head); the state then has shape (B, c, *extra, ...).

Step mode holds either a finite state ("fixed": modal, s4d, rational, conv1d) or the
past filter inputs ("cache": fno, ckconv, hyena; `taps` may pass forward(t + 1)
computed once for all channel groups of a step). Every state dict has a "fixed"
entry (empty, shape (B, 0), for the cached filters).

This module maps each family's name to its module (`build_filter`); the families live in a
module per parametrization, on what they share (filter_base.py: full precision under a half
cast, the cached step):

    modal_filters.py      modal, s4d: sums of damped complex exponentials (finite state)
    rational_filter.py    rational: a rational transfer function (finite state)
    explicit_filters.py   conv1d (taps, finite state), fno (a spectrum, cached)
    implicit_filters.py   ckconv, hyena: an MLP of the time coordinate (cached)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from madsl.layers.explicit_filters import Conv1dFilter, FNOFilter
from madsl.layers.implicit_filters import CKConvFilter, HyenaFilter
from madsl.layers.modal_filters import ModalFilter, S4DFilter
from madsl.layers.rational_filter import RationalFilter

LongFilter = ModalFilter | S4DFilter | RationalFilter | Conv1dFilter | FNOFilter | CKConvFilter | HyenaFilter


# The module of each filter family, from the filter's channel count and the layer's filter
# sizes (`madsl.primitives.filters.FILTER_OPTIONS`, validated there by `validate_filter`).
FILTER_MODULES: dict[str, Callable[..., nn.Module]] = {
    "modal": lambda channels, sizes: ModalFilter(channels, sizes["filter_states"]),
    "s4d": lambda channels, sizes: S4DFilter(channels, sizes["filter_states"]),
    "rational": lambda channels, sizes: RationalFilter(channels, sizes["filter_states"], sizes["filter_length"]),
    "conv1d": lambda channels, sizes: Conv1dFilter(channels, sizes["filter_size"]),
    "fno": lambda channels, sizes: FNOFilter(channels, sizes["filter_modes"], sizes["filter_length"]),
    "ckconv": lambda channels, sizes: CKConvFilter(channels, sizes["filter_order"], sizes["filter_length"]),
    "hyena": lambda channels, sizes: HyenaFilter(
        channels,
        sizes["filter_order"],
        sizes["filter_emb_dim"],
        reference_length=sizes["filter_length"],
        learned_features=sizes["filter_emb_learned"],
    ),
}


def build_filter(kind: str, channels: int, **sizes: int) -> nn.Module:
    """The filter module named by a layer's `filter` hyperparameter (the kinds of
    madsl.primitives.filters.FILTERS) with `channels` channels; `sizes` are the layer's
    filter hyperparameters (each kind reads the ones it uses)."""
    return FILTER_MODULES[kind](channels, sizes)
