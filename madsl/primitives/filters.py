"""Accounting of the long-convolution filters of the Hyena family.

A Hyena-type operator convolves `channels` signals with long causal filters.
How the filter is parametrized decides its parameters and whether the operator
has a finite recurrent state:

- `modal`: the filter is a sum of damped complex exponentials,
  h[t] = Re(sum_n R_n * lambda_n**t), one set of `filter_states` modes per
  channel ("Laughing Hyena", Massaroli et al. 2023; MAD paper App. B.3.2 cites it
  as Hyena's featurization). Each mode has a pole and a residue, stored as four
  real numbers (log|lambda|, arg lambda, Re R, Im R). It is a diagonal SSM, so the
  operator runs as a recurrence whose state is `filter_states` complex numbers per
  channel: fixed state = channels * filter_states.
- `hyena`: the implicit MLP filter of the Hyena paper (App. A): a positional
  embedding of `filter_emb_dim` features, an MLP of width `filter_order` with sine
  activations (one learned frequency vector shared by all of them), a bias per
  channel and an exponential-decay window. It has no finite state: generating
  token by token needs every past input (a dynamic state of channels * L).
"""
from __future__ import annotations

from dataclasses import dataclass

FILTERS = ("modal", "hyena")


@dataclass(frozen=True)
class FilterCost:
    params: int
    fixed_state: int
    dynamic_per_token: int  # numbers kept per past token (0 for recurrent filters)
    featurization_flops_per_token: int  # "S_hyena * D" of MAD paper App. C.4.2


def filter_cost(kind: str, channels: int, *, filter_states: int, filter_order: int,
                filter_emb_dim: int) -> FilterCost:
    if kind == "modal":
        return FilterCost(params=4 * channels * filter_states, fixed_state=channels * filter_states,
                          dynamic_per_token=0, featurization_flops_per_token=filter_states * channels)
    if kind == "hyena":
        order, emb = filter_order, filter_emb_dim
        mlp = (emb * order + order) + 2 * (order * order + order) + order * channels
        sine_freq = order
        bias = channels
        return FilterCost(params=mlp + sine_freq + bias, fixed_state=0, dynamic_per_token=channels,
                          featurization_flops_per_token=order * channels)
    raise ValueError(f"unknown filter {kind!r}")
