"""RWKV-7 time mixing (`R7`): the torch module of `madsl.primitives.rwkv7`.

    x_c = x + (x_{t-1} - x) * mu_c                    c in r, w, k, v, a, g (the token shift)
    r, k, v = r_proj(x_r), k_proj(x_k), v_proj(x_v)
    log w = -e^-0.5 sigmoid(w_lora(x_w));  a = sigmoid(a_lora(x_a));  g = g_lora(x_g)
    kk = l2norm(k * k_k) per head;  k = k * (1 + (a - 1) * k_a)
    S_t = diag(w_t) S_{t-1} - (kk * a)(kk^T S_{t-1}) + k v^T,  o_t = S_t^T r_t
    out = o_proj((groupnorm(o) + (sum_d r k r_k) v) * g)

value_residual: v = lerp(v, v_first, sigmoid(v_lora(x_v))) (fla's `torch.lerp`), v_first the values of
the model's first R7 layer in the same call, handed over by a `ValueLink` the compiler gives both
(`value_source` on the first, `value_first` on each later one); unlinked, v_first is zeros (fla's
v_first before its first layer). kk's norm: F.normalize where l2norm_eps is 0, else
k / sqrt(|k|^2 + eps) (fla's fused l2_norm).

Training runs `madsl.kernels.dplr.dplr_parallel` (the chunked form, pure PyTorch); `step` the
recurrence one token at a time; `prefill` the chunked form with its final state (one pass over the
inputs, so a linked first layer hands its whole sequence of values to the later ones).
State: "fixed" (batch, heads, head_dim, head_dim) and "conv"
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

from madsl.kernels.dplr import dplr_chunked, dplr_parallel, dplr_step
from madsl.primitives.rwkv7 import RWKV7 as RWKV7Primitive

MIXES = ("r", "w", "k", "v", "a", "g")
LOG_DECAY_BOUND = -math.exp(-0.5)  # log w in (-e^-0.5, 0): w in (0.545, 1)


class ValueLink:
    """The values (.., dim) of a model's first R7 layer in the current forward, step or prefill, which
    its layers with value_residual read in the same call (set by the first, which runs before them)."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: Tensor | None = None


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
        # the value residual's LoRA (fla's v_lora: no inner activation, a bias), only where it is on
        self.v_lora = _lora(dim, p.value_rank, dim, nn.Identity(), bias=True) if p.value_residual else None
        self.l2norm_eps = p.l2norm_eps
        # set by the compiler (madsl/compiler.py): where this layer leaves its values, where it reads v_first
        self.value_source: ValueLink | None = None
        self.value_first: ValueLink | None = None
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
        if self.v_lora is not None:  # fla's v0: 0.73 - 0.4 linear (PyTorch's default for its weights)
            self.v_lora[2].bias.copy_(0.73 - linear * 0.4)

    def _mixed(self, x: Tensor, previous: Tensor) -> dict[str, Tensor]:
        delta = previous - x
        return {c: x + delta * self.mix[c] for c in MIXES}

    def _inputs(self, x: Tensor, previous: Tensor) -> tuple[Tensor, ...]:
        """r, w (log), k, v, a, b (.., heads, head_dim) of the recurrence, and g (.., dim)."""
        m = self._mixed(x, previous)

        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (self.heads, self.head_dim))

        r, k, v = self.r_proj(m["r"]), self.k_proj(m["k"]), self.v_proj(m["v"])
        if self.value_source is not None:
            self.value_source.values = v
        if self.v_lora is not None:
            first = self.value_first.values if self.value_first is not None else None
            v = torch.lerp(v, torch.zeros_like(v) if first is None else first, torch.sigmoid(self.v_lora(m["v"])))
        log_w = LOG_DECAY_BOUND * torch.sigmoid(self.w_lora(m["w"]))
        a = torch.sigmoid(self.a_lora(m["a"]))
        kk = self._l2norm(heads(k * self.k_k))
        k = k * (1 + (a - 1) * self.k_a)
        return heads(r), heads(log_w), heads(k), heads(v), -kk, kk * heads(a), self.g_lora(m["g"])

    def _l2norm(self, x: Tensor) -> Tensor:
        if self.l2norm_eps == 0:
            return F.normalize(x, dim=-1)
        return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + self.l2norm_eps)

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

    @torch.no_grad()
    def prefill(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The forward over a prompt and the state after it, from one pass over the inputs."""
        previous = F.pad(x, (0, 0, 1, -1))
        r, log_w, k, v, a, b, g = self._inputs(x, previous)
        o, fixed = dplr_chunked(*(t.transpose(1, 2) for t in (r, log_w, k, v, a, b)))
        y = self._readout(o.transpose(1, 2).to(x.dtype), r, k, v, g)
        return y, {"fixed": fixed.to(x.dtype), "conv": x[:, -1]}

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
