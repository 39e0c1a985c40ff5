"""RWKV-5 / RWKV-6 time mixers (`R5`, `R6`) and their channel mixer (`R5c`, `R6c`): the torch
modules of `madsl.primitives.rwkv`.

Time mixer (x_prev: the previous token's input, zero before the first):

    d = x_prev - x;  x_c = x + d * maa_c                    c in r, k, v, g (RWKV-5)
    RWKV-6: x_c = x + d * (maa_c + lora_c(x + d * maa_x))  c in w, k, v, r, g ("ddlerp")
    r, k, v, g = receptance(x_r), key(x_k), value(x_v), silu(gate(x_g))
    log w = -exp(time_decay [+ tanh(x_w W1) W2 (RWKV-6)])
    o_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(w_t) S_{t-1} + k_t v_t^T
    out = output(group_norm(o / head_dim_divisor) * g)

The WKV readout uses the state before the token, plus the bonus term. The parallel form runs
GLA (`madsl.kernels.gla`: fla's `chunk_gla` on CUDA where installed, else `gla_chunked`) on k, v
and log w shifted by one token (its state after token t is then S_{t-1}) and adds the bonus
(r_t . u k_t) v_t; `step` runs the recurrence. State:
"fixed" (batch, heads, head_dim, head_dim) and "conv" (batch, dim), the previous input.

Init: the reference's for a single layer (layer_id 0 of n_layer 1): maa = 1 - (i / dim) (k, v, x,
w), 1 - (i / dim)^0.5 (r, g); time_decay -6 + 5 (n / (A - 1))^0.7; bonus ((n + 1) % 3 - 1) * 0.1;
the low-rank maps U(-1e-4, 1e-4); PyTorch's default Linear init; ln_x weight one, bias zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels import gla
from madsl.primitives.rwkv import RWKV as RWKVPrimitive
from madsl.primitives.rwkv import RWKVChannel as RWKVChannelPrimitive


def _previous(x: Tensor) -> Tensor:
    """x (batch, L, dim) -> the input one token back (zero before the first)."""
    return F.pad(x, (0, 0, 1, -1))


def _ramp(dim: int) -> Tensor:
    return torch.arange(dim, dtype=torch.float32) / dim


class RWKV(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: RWKVPrimitive):
        super().__init__()
        dim, att = p.dim, p.att
        self.heads, self.head_dim, self.divisor = p.heads, p.head_dim, float(p.head_dim_divisor)
        self.data_dependent = p.version == 6
        ramp = _ramp(dim)
        mixes = {"k": 1 - ramp, "v": 1 - ramp, "r": 1 - ramp.sqrt(), "g": 1 - ramp.sqrt()}
        if self.data_dependent:
            mixes = {"x": 1 - ramp, "w": 1 - ramp, **mixes}
            self.maa_w1 = nn.Parameter(torch.empty(dim, 5 * p.mix_rank).uniform_(-1e-4, 1e-4))
            self.maa_w2 = nn.Parameter(torch.empty(5, p.mix_rank, dim).uniform_(-1e-4, 1e-4))
            self.decay_w1 = nn.Parameter(torch.empty(dim, p.decay_rank).uniform_(-1e-4, 1e-4))
            self.decay_w2 = nn.Parameter(torch.empty(p.decay_rank, att).uniform_(-1e-4, 1e-4))
        self.maa = nn.ParameterDict({c: nn.Parameter(m) for c, m in mixes.items()})
        n = torch.arange(att, dtype=torch.float32)
        self.time_decay = nn.Parameter(-6 + 5 * (n / max(att - 1, 1)) ** 0.7)
        self.bonus = nn.Parameter(((n + 1) % 3 - 1) * 0.1)
        self.receptance = nn.Linear(dim, att, bias=False)
        self.key = nn.Linear(dim, att, bias=False)
        self.value = nn.Linear(dim, att, bias=False)
        self.gate = nn.Linear(dim, att, bias=False)
        self.output = nn.Linear(att, dim, bias=False)
        self.ln_x = nn.GroupNorm(p.heads, att, eps=1e-5)

    def _inputs(self, x: Tensor, x_prev: Tensor) -> tuple[Tensor, ...]:
        """x, x_prev (..., dim) -> r, k, v, log w (..., heads, head_dim) and g (..., att)."""
        d = x_prev - x
        if self.data_dependent:
            lora = torch.tanh((x + d * self.maa["x"]) @ self.maa_w1).unflatten(-1, (5, -1))
            # one matmul per mix (an einsum, not a broadcast matmul: that would expand maa_w2 per token)
            lora = torch.einsum("...fr,frd->...fd", lora, self.maa_w2).unbind(-2)  # 5 x (..., dim)
            mixed = {c: x + d * (self.maa[c] + m) for c, m in zip("wkvrg", lora)}
            decay = self.time_decay + torch.tanh(mixed["w"] @ self.decay_w1) @ self.decay_w2
        else:
            mixed = {c: x + d * self.maa[c] for c in "kvrg"}
            decay = self.time_decay.expand(*x.shape[:-1], -1)

        def heads(t):
            return t.unflatten(-1, (self.heads, self.head_dim))

        r, k, v = heads(self.receptance(mixed["r"])), heads(self.key(mixed["k"])), heads(self.value(mixed["v"]))
        log_w = heads(-decay.float().exp() if decay.dtype != torch.float64 else -decay.exp())
        return r, k, v, log_w, F.silu(self.gate(mixed["g"]))

    def _bonus(self, r: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(r_t . u k_t) v_t per head."""
        u = self.bonus.view(self.heads, self.head_dim)
        return (r * u * k).sum(-1, keepdim=True) * v

    def _readout(self, o: Tensor, g: Tensor) -> Tensor:
        lead = o.shape[:-2]
        o = o.flatten(-2).reshape(-1, self.heads * self.head_dim) / self.divisor
        o = self.ln_x(o.to(self.ln_x.weight.dtype)).view(*lead, -1)
        return self.output(o.to(g.dtype) * g)

    def forward(self, x: Tensor) -> Tensor:
        r, k, v, log_w, g = self._inputs(x, _previous(x))

        # gla's state after token t is S_{t-1} when it reads k, v and log w one token late
        def late(t):
            return F.pad(t, (0, 0, 0, 0, 1, -1)).transpose(1, 2)

        wkv = gla.gla_fla_chunk if gla.fla_applies(x) else gla.gla_chunked  # fla's kernel on CUDA, where installed
        o, _ = wkv(r.transpose(1, 2), late(k), late(v), late(log_w))
        o = o.transpose(1, 2).to(v.dtype) + self._bonus(r, k, v)
        return self._readout(o, g)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.output.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.heads, self.head_dim, self.head_dim, device=device, dtype=dtype),
            "conv": torch.zeros(batch, self.output.out_features, device=device, dtype=dtype),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        r, k, v, log_w, g = self._inputs(x_t, state["conv"])
        S = state["fixed"]
        o = (r.unsqueeze(-2) @ S).squeeze(-2).to(v.dtype) + self._bonus(r, k, v)
        S = log_w.exp().to(S.dtype).unsqueeze(-1) * S + k.unsqueeze(-1) * v.unsqueeze(-2)
        return self._readout(o, g), {"fixed": S, "conv": x_t}


class RWKVChannel(nn.Module):
    """out = sigmoid(receptance(x_r)) * value(relu(key(x_k))^2), x_c = x + (x_prev - x) * maa_c;
    without the receptance (RWKV-7's) out = value(relu(key(x_k))^2)."""

    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: RWKVChannelPrimitive):
        super().__init__()
        ramp = _ramp(p.dim)
        # RWKV-7's channel mixer has no receptance gate (fla's RWKV7FeedForward): out = value(k) alone;
        # built in the order RWKV-5/6's always were, so a seed draws the same weights
        self.maa_k = nn.Parameter(1 - ramp)
        self.maa_r = nn.Parameter(1 - ramp) if p.receptance else None
        self.key = nn.Linear(p.dim, p.inner, bias=False)
        self.receptance = nn.Linear(p.dim, p.dim, bias=False) if p.receptance else None
        self.value = nn.Linear(p.inner, p.dim, bias=False)

    def _mix(self, x: Tensor, x_prev: Tensor) -> Tensor:
        d = x_prev - x
        k = torch.relu(self.key(x + d * self.maa_k)).square()
        if self.receptance is None:
            return self.value(k)
        return torch.sigmoid(self.receptance(x + d * self.maa_r)) * self.value(k)

    def forward(self, x: Tensor) -> Tensor:
        return self._mix(x, _previous(x))

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.value.weight
        return {
            "conv": torch.zeros(batch, weight.shape[0], device=device or weight.device, dtype=dtype or weight.dtype)
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        return self._mix(x_t, state["conv"]), {"conv": x_t}
