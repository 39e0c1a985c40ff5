"""Hyena experts (`He`): the torch module of `madsl.primitives.hyena_experts`.

An order-2 Hyena over dim = experts * expert_width channels, grouped into experts
(of x_0, x_1, v and the long filter, expert e owns channels e*expert_width + j with
`expert_layout: blocked`, channels j*experts + e with `interleaved`, j < expert_width: the
MAD reference's `HyenaExpertsOperator`, which reshapes its output to (..., expert_width,
experts)); a router mixes the experts' outputs per token (MAD paper §3.3):

    z = short_conv(in_proj(u));  x_0, x_1, v = split(z)        dim -> 3*dim, as Hyena
    o = x_0 * (h * (v * x_1))                                  (B, L, experts, expert_width)
    w_t = softmax over the top-`active` router logits of u_t W_g; every other expert gets exactly 0
    y_t = out_proj( sum_e w_{t,e} o_{t,e} )                    out_proj: expert_width -> dim

All experts are computed densely (cheaper on a CPU than gathering), but the output is
the sparse definition: an unselected expert has weight 0 and no gradient flows through it.
Ties at the k-th logit are broken by torch.topk. With `leaky_routing` (the MAD reference
code's routing) the logits below the k-th largest are set to 0 instead of -inf before a
softmax over all experts, so unselected experts keep weight e^0 / Z (ties at the k-th
logit all keep theirs).

Init: Hyena's (safari: nn.Linear / nn.Conv1d defaults); the router is nn.Linear's
default, with a bias where `router_bias` (the MAD reference's router is a plain nn.Linear).

State for `step`: as Hyena at order 2 over dim channels: "conv" (B, 3*dim,
short_filter-1); modal: "fixed" complex (B, dim, filter_states) = 2048 at width 128,
all experts' states, since which experts are active depends on the input; the other
filter families carry their own state (madsl.layers.filters), as in Hyena.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import ConvMethod, causal_conv, short_causal_conv
from madsl.layers.filters import build_filter
from madsl.layers.routing import route
from madsl.primitives.filters import filter_config
from madsl.primitives.hyena_experts import HyenaExperts as HyenaExpertsPrimitive


class HyenaExperts(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: HyenaExpertsPrimitive):
        super().__init__()
        dim, bias = p.dim, p.bias
        self.dim = dim
        self.experts = p.experts
        self.expert_width = p.expert_width
        self.active = p.active
        self.leaky_routing = p.leaky_routing
        self.interleaved = p.expert_layout == "interleaved"
        self.short_filter = p.short_filter
        self.conv_method: ConvMethod = "auto"
        self.router = nn.Linear(dim, p.experts, bias=p.router_bias)
        self.in_proj = nn.Linear(dim, 3 * dim, bias=bias)
        # holds the depthwise weights; applied causally by short_causal_conv (and by hand in step)
        self.short_conv = nn.Conv1d(3 * dim, 3 * dim, p.short_filter, groups=3 * dim, bias=bias)
        self.long_filter = build_filter(p.filter, dim, **filter_config(p))
        self.out_proj = nn.Linear(p.expert_width, dim, bias=bias)

    def routing_weights(self, u: Tensor) -> Tensor:
        """(..., dim) -> (..., experts): softmax over the top-`active` logits, exactly 0 elsewhere
        (leaky_routing: softmax over all logits, those below the top `active` set to 0)."""
        # Routing in full precision under autocast, as the MoE layer routes: a bf16 router flips
        # the top-k choice of near-tied tokens, and CUDA autocast runs softmax in float32 (the
        # scatter of float32 weights into bf16 zeros failed on an H100).
        with torch.autocast(device_type=u.device.type, enabled=False):
            logits = self.router(u.to(self.router.weight.dtype))
            return route(logits, self.active, self.leaky_routing)

    def _combine(self, expert_out: Tensor, weights: Tensor) -> Tensor:
        """expert_out (..., dim), weights (..., experts) -> out_proj(sum_e w_e o_e) (..., dim)."""
        if self.interleaved:  # channel j*experts + e is expert e's j-th
            per_expert = expert_out.unflatten(-1, (self.expert_width, self.experts))
            return self.out_proj((weights.unsqueeze(-2) * per_expert).sum(-1))
        per_expert = expert_out.unflatten(-1, (self.experts, self.expert_width))
        return self.out_proj((weights.unsqueeze(-1) * per_expert).sum(-2))

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        seq_len = u.shape[1]
        z = short_causal_conv(self.in_proj(u), self.short_conv.weight, self.short_conv.bias)  # (B, 3*dim, L)
        out_gate, in_gate, v = z.split(self.dim, dim=1)
        v = causal_conv(v * in_gate, self.long_filter(seq_len), self.long_filter.skip, method=self.conv_method)
        return self._combine((v * out_gate).transpose(1, 2), self.routing_weights(u))

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.in_proj.weight.device
        dtype = dtype if dtype is not None else self.in_proj.weight.dtype
        state = self.long_filter.init_state(batch, device, dtype)
        state["conv"] = torch.zeros(batch, 3 * self.dim, self.short_filter - 1, device=device, dtype=dtype)
        return state

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        window = torch.cat([state["conv"], self.in_proj(u_t).unsqueeze(-1)], dim=-1)  # (B, 3*dim, short_filter)
        z = (window * self.short_conv.weight.squeeze(1)).sum(-1)
        if self.short_conv.bias is not None:
            z = z + self.short_conv.bias
        out_gate, in_gate, v = z.split(self.dim, dim=-1)
        filter_state = {key: value for key, value in state.items() if key != "conv"}
        v, new_state = self.long_filter.step(v * in_gate, filter_state)
        new_state["conv"] = window[..., 1:]
        return self._combine(v * out_gate, self.routing_weights(u_t)), new_state
