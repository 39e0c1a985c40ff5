"""Hyena operator (`H`): the torch module of `madsl.primitives.hyena`.

Layout (order N, inner width I = inner_factor * dim, G = proj_groups; as safari's
`HyenaOperator` and the MAD reference's):

    p = in_proj(u)                                  dim -> (N+1)*I/G
    z = short_conv([p, p, ..., p])                  p repeated G times: (N+1)*I channels, depthwise
                                                    causal conv of short_filter taps
    x_0, x_1, ..., x_{N-1}, v = split(z)            I channels each
    for o = 0 .. N-2:  v = h_o * (v * x_{N-1-o})    long causal conv by group o of the filter's channels
    y = out_proj(v * x_0)                           I -> dim

The long filter has (N-1)*I channels (group o is channels o*I .. (o+1)*I), one
of the families of `madsl.layers.filters`: with a finite state (`modal`, `s4d`,
`rational`, `conv1d`) or keeping past inputs (`fno`, `ckconv`, `hyena`); `s4d`,
`rational` and `hyena` add a per-channel skip term.

Init (safari's HyenaOperator): nn.Linear's and nn.Conv1d's default init for in_proj,
out_proj and short_conv (uniform in +-1/sqrt(fan_in); fan_in = short_filter for the
depthwise conv); biases where `bias`. The long filters document their own.

State for `step`: "conv" (B, (N+1)*I/G, short_filter-1), the last in_proj outputs
(before the repetition); modal: "fixed" complex (B, (N-1)*I, filter_states) = 2048
numbers at width 128 (s4d, rational, conv1d: their own "fixed" state, see the filters);
fno, ckconv, hyena: "fixed" empty and "cache" (B, (N-1)*I, t), the past filter inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from madsl.kernels.fftconv import ConvMethod, causal_conv, short_causal_conv
from madsl.layers.filters import build_filter
from madsl.primitives.filters import filter_config
from madsl.primitives.hyena import Hyena as HyenaPrimitive


class Hyena(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: HyenaPrimitive):
        super().__init__()
        dim, bias = p.dim, p.bias
        self.inner = p.inner
        self.order = p.order
        self.proj_groups = p.proj_groups
        self.short_filter = p.short_filter
        self.conv_method: ConvMethod = "auto"  # see madsl.kernels.fftconv.causal_conv
        self.in_proj = nn.Linear(dim, p.proj_width, bias=bias)
        # holds the depthwise weights; applied causally by short_causal_conv (and by hand in step)
        self.short_conv = nn.Conv1d(p.width, p.width, p.short_filter, groups=p.width, bias=bias)
        self.long_filter = build_filter(p.filter, p.filter_channels, **filter_config(p))
        self.out_proj = nn.Linear(p.inner, dim, bias=bias)

    def _group(self, o: int) -> slice:
        """Filter channels of long convolution o."""
        return slice(o * self.inner, (o + 1) * self.inner)

    def _project(self, u: Tensor) -> Tensor:
        """in_proj's outputs repeated over the projection groups (along the last axis)."""
        p = self.in_proj(u)
        return p.repeat(*([1] * (p.dim() - 1)), self.proj_groups) if self.proj_groups > 1 else p

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        seq_len = u.shape[1]
        z = short_causal_conv(self._project(u), self.short_conv.weight, self.short_conv.bias)  # (B, (N+1)*I, L)
        *gates, v = z.split(self.inner, dim=1)
        taps = self.long_filter(seq_len)
        skip = self.long_filter.skip
        for o in range(self.order - 1):
            group = self._group(o)
            v = causal_conv(
                v * gates[self.order - 1 - o],
                taps[group],
                None if skip is None else skip[group],
                method=self.conv_method,
            )
        return self.out_proj((v * gates[0]).transpose(1, 2))

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        device = device if device is not None else self.in_proj.weight.device
        dtype = dtype if dtype is not None else self.in_proj.weight.dtype
        state = self.long_filter.init_state(batch, device, dtype)
        state["conv"] = torch.zeros(batch, self.in_proj.out_features, self.short_filter - 1, device=device, dtype=dtype)
        return state

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        window = torch.cat([state["conv"], self.in_proj(u_t).unsqueeze(-1)], dim=-1)  # (B, proj width, short_filter)
        repeated = window.repeat(1, self.proj_groups, 1) if self.proj_groups > 1 else window
        z = (repeated * self.short_conv.weight.squeeze(1)).sum(-1)
        if self.short_conv.bias is not None:
            z = z + self.short_conv.bias
        *gates, v = z.split(self.inner, dim=-1)

        filter_state = {key: value for key, value in state.items() if key != "conv"}
        channel_keys = self.long_filter.channel_keys  # state entries whose axis 1 is the filter channel
        # the implicit filter's taps up to this step, computed once for all groups
        taps = self.long_filter(state["cache"].shape[-1] + 1) if "cache" in state else None
        parts: list[dict[str, Tensor]] = []
        for o in range(self.order - 1):
            group = self._group(o)
            part = {key: value[:, group] if key in channel_keys else value for key, value in filter_state.items()}
            v, part = self.long_filter.step(v * gates[self.order - 1 - o], part, group, taps=taps)
            parts.append(part)
        new_state = {
            key: torch.cat([part[key] for part in parts], dim=1) if key in channel_keys else parts[-1][key]
            for key in filter_state
        }
        new_state["conv"] = window[..., 1:]
        return self.out_proj(v * gates[0]), new_state
