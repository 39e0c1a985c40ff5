"""RWKV-7 time mixing (`R7`): the torch module of `madsl.primitives.rwkv7`.

    x_c = x + (x_{t-1} - x) * mu_c                    c in r, w, k, v, a, g (the token shift)
    r, k, v = r_proj(x_r), k_proj(x_k), v_proj(x_v)
    log w = -e^-0.5 sigmoid(w_lora(x_w));  a = sigmoid(a_lora(x_a));  g = g_lora(x_g)
    kk = l2norm(k * k_k) per head;  k = k * (1 + (a - 1) * k_a)
    S_t = diag(w_t) S_{t-1} - (kk * a)(kk^T S_{t-1}) + k v^T,  o_t = S_t^T r_t
    out = o_proj((groupnorm(o) + (sum_d r k r_k) v) * g)

Training runs `madsl.kernels.dplr.dplr_parallel` (the chunked form, pure PyTorch); `step` the
recurrence one token at a time. State: "fixed" (batch, heads, head_dim, head_dim) and "conv"
(batch, dim), the previous token's input.

Init: fla's RWKV7Attention for a first layer (its mixes, k_k, k_a, r_k and the LoRA biases from
the channel index), orthogonal r, k (gain 0.1) and v; PyTorch's default for the LoRA weights and
o_proj (fla zeroes o_proj; a zero output would leave the layer mute in madsl's short learning
tests until its first step), GroupNorm weight one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.dplr import dplr_parallel, dplr_step
from madsl.primitives.rwkv7 import RWKV7 as RWKV7Primitive

MIXES = ("r", "w", "k", "v", "a", "g")
LOG_DECAY_BOUND = -math.exp(-0.5)  # log w in (-e^-0.5, 0): w in (0.545, 1)


def _lora(dim: int, rank: int, out: int, inner: nn.Module, bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, rank, bias=False), inner, nn.Linear(rank, out, bias=bias))


class RWKV7(nn.Module):
    stacks = True  # exact under vmap over stacked members: plain ops, the chunked form folds

    def __init__(self, p: RWKV7Primitive):
        super().__init__()
        dim = p.dim
        self.dim, self.heads, self.head_dim = dim, p.heads, p.head_dim
        self.mix = nn.ParameterDict({c: nn.Parameter(torch.zeros(dim)) for c in MIXES})
        self.k_k = nn.Parameter(torch.zeros(dim))
        self.k_a = nn.Parameter(torch.zeros(dim))
        self.r_k = nn.Parameter(torch.zeros(p.heads, p.head_dim))
        self.r_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w_lora = _lora(dim, p.decay_rank, dim, nn.Tanh(), bias=True)
        self.a_lora = _lora(dim, p.a_rank, dim, nn.Identity(), bias=True)
        self.g_lora = _lora(dim, p.gate_rank, dim, nn.Sigmoid(), bias=False)
        self.g_norm = nn.GroupNorm(p.heads, dim, eps=p.head_dim * 1e-5)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        dim, n = self.dim, torch.arange(self.dim, dtype=torch.float64)
        linear = n / (dim - 1) - 0.5 if dim > 1 else n * 0
        half = max((self.head_dim - 1) / 2, 0.5)
        zigzag = ((n % self.head_dim) - half) / half
        zigzag = zigzag * zigzag.abs()
        for c, power in zip(MIXES, (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)):
            self.mix[c].copy_(1.0 - (n / dim) ** power)
        self.k_k.copy_(0.71 - linear * 0.1)
        self.k_a.fill_(1.02)
        self.r_k.fill_(-0.04)
        decay_bias = -6 + 6 * (n / max(dim - 1, 1)) + 0.5 + zigzag * 2.5
        self.w_lora[2].bias.copy_(decay_bias)
        self.a_lora[2].bias.copy_(-0.19 + zigzag * 0.3 + linear * 0.4)
        for proj, gain in ((self.r_proj, 1.0), (self.k_proj, 0.1), (self.v_proj, 1.0)):
            nn.init.orthogonal_(proj.weight, gain=gain)

    def _mixed(self, x: Tensor, previous: Tensor) -> dict[str, Tensor]:
        delta = previous - x
        return {c: x + delta * self.mix[c] for c in MIXES}

    def _inputs(self, x: Tensor, previous: Tensor) -> tuple[Tensor, ...]:
        """r, w (log), k, v, a, b (.., heads, head_dim) of the recurrence, and g (.., dim)."""
        m = self._mixed(x, previous)

        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.heads, self.head_dim))

        r, k, v = self.r_proj(m["r"]), self.k_proj(m["k"]), self.v_proj(m["v"])
        log_w = LOG_DECAY_BOUND * torch.sigmoid(self.w_lora(m["w"]))
        a = torch.sigmoid(self.a_lora(m["a"]))
        kk = F.normalize(heads(k * self.k_k), dim=-1)
        k = k * (1 + (a - 1) * self.k_a)
        return heads(r), heads(log_w), heads(k), heads(v), -kk, kk * heads(a), self.g_lora(m["g"])

    def _readout(self, o: Tensor, r: Tensor, k: Tensor, v: Tensor, g: Tensor) -> Tensor:
        """o, r, k, v (.., heads, head_dim) -> out (.., dim)."""
        lead = o.shape[:-2]
        o = self.g_norm(o.reshape(-1, self.dim)).view(*lead, self.dim)
        bonus = ((r * k * self.r_k).sum(-1, keepdim=True) * v).flatten(-2)
        return self.o_proj((o + bonus) * g)

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        previous = F.pad(x, (0, 0, 1, -1))  # the token shift: x_{t-1}, zero before the first token
        r, log_w, k, v, a, b, g = self._inputs(x, previous)
        o = dplr_parallel(*(t.transpose(1, 2) for t in (r, log_w, k, v, a, b))).transpose(1, 2)
        return self._readout(o, r, k, v, g)

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.o_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.heads, self.head_dim, self.head_dim, device=device, dtype=dtype),
            "conv": torch.zeros(batch, self.dim, device=device, dtype=dtype),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        r, log_w, k, v, a, b, g = self._inputs(x_t, state["conv"])
        o, fixed = dplr_step(r, log_w, k, v, a, b, state["fixed"])
        return self._readout(o, r, k, v, g), {"fixed": fixed, "conv": x_t}
