"""Hymba's hybrid-head mixer (`Hb`): the torch module of `madsl.primitives.hymba` (NVIDIA's Hymba-1.5B,
`HymbaBlock`; its formulas and sizes are the primitive's docstring).

    q, k, v, x, z = split(in_proj(u))            a KV consumer's in_proj has no k, v rows
    S = Mamba-1(x, z)                            conv + SiLU, dt/B/C RMSNorms, selective scan, D skip, * silu(z)
    A = attention(rotary(q), rotary(k), v)       GQA, scale dq^-0.5, causal or window + sinks mask
    out = out_proj((norm1(A) + norm2(S)) / 2)

The SSM half runs Mamba's kernels and keeps its state format (madsl/layers/mamba.py: the CPU scan, mamba-ssm's
scan and causal-conv1d on CUDA, the member folds under vmap). Every RMSNorm is Hymba's HymbaRMSNorm: the input
normalised in float32 (float64 for a float64 input), cast back, then times the weight. Parameter names are
Hymba's (in_proj, conv1d, x_proj, dt_proj, A_log, D, dt_layernorm, B_layernorm, C_layernorm,
pre_avg_layernorm1/2, out_proj; its x_proj.0, dt_proj.0, A_log.0 and D.0 without the list index).

Attention runs through SDPA; where dv differs from dq the narrower side is zero-padded to the wider (zeros add
nothing to q.k; the padded output channels are cut), as madsl's MLA does. With a window the parallel form
masks densely: query q sees key k iff k <= q and (q - k < window or k < sinks).

KV sharing: a producer (kv_reuse false) with a `kv_source` KVLink writes its post-rotary keys and values there
on every call: (B, KV, L, dq) and (B, KV, L, dv) in forward and prefill, its whole cache after appending the
new token in step. A consumer reads its `kv_from` KVLink in the same call (its producer runs first; the
compiler links the two); without one it raises RuntimeError. Rotary is applied at the layer's own positions
(0.. in forward and prefill, the state's "pos" in step), the same for producer and consumer.

State for `step`: "fixed" (B, E, N), the scan's state; "conv" (B, E, d_conv - 1), the last conv inputs;
"pos" (B,) int64, the next position; a producer also "k" (B, KV, T, dq) and "v" (B, KV, T, dv), every past
token's (never trimmed, also with a window: the mask picks the window and the sinks among them).

Init: mamba-ssm's for the SSM (dt_proj's weight and bias, A_log = log(1..N), D = 1, as madsl's Mamba),
PyTorch's default Linear init for in_proj, x_proj and out_proj, norm weights one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.attention import scaled_dot_product_attention
from madsl.layers.mamba import Mamba as MambaLayer
from madsl.layers.mamba import at_least_fp32, mamba_scan
from madsl.layers.rotary import rotate
from madsl.primitives.hymba import Hymba as HymbaPrimitive


class KVLink:
    """A producer's post-rotary keys and values for the current call, `value = (k, v)` (k (B, KV, T, dq), v
    (B, KV, T, dv)), written by the producer (its `kv_source`) before its consumers read it (`kv_from`)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: tuple[Tensor, Tensor] | None = None


class _RMSNorm(nn.Module):
    """HymbaRMSNorm: weight * (x / sqrt(mean(x^2) + eps)), the normalisation in float32 or better."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        precise = at_least_fp32(x)
        return self.weight * F.rms_norm(precise, precise.shape[-1:], eps=self.eps).to(x.dtype)


def _repeat_heads(x: Tensor, groups: int) -> Tensor:
    """(B, KV, T, d) -> (B, KV * groups, T, d): query head h reads key/value head h // groups."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class Hymba(nn.Module):
    stacks = True  # exact under vmap over stacked members: plain ops; the scan, conv and SDPA fold

    # Mamba's causal conv + SiLU (CPU conv, causal-conv1d on CUDA): they read conv1d and d_conv alone
    _cuda_conv = MambaLayer._cuda_conv
    _causal_conv_silu = MambaLayer._causal_conv_silu

    def __init__(self, p: HymbaPrimitive):
        super().__init__()
        self.primitive = p  # what a producer beside a consumer is built from (tests/test_contract.py)
        dim, E, N, R = p.dim, p.d_inner, p.d_state, p.rank
        self.d_inner, self.d_state, self.d_conv, self.dt_rank = E, N, p.d_conv, R
        self.heads, self.kv_heads, self.groups = p.heads, p.key_value_heads, p.groups
        self.qk_head_dim, self.v_head_dim = p.qk_head_dim, p.v_head_dim
        self.window, self.sinks = p.window, p.sinks
        self.rotary, self.rope_theta = p.rotary, float(p.rope_theta)
        self.kv_reuse = p.kv_reuse
        self.in_proj = nn.Linear(dim, p.projected, bias=False)
        self.conv1d = nn.Conv1d(E, E, kernel_size=p.d_conv, groups=E, padding=p.d_conv - 1, bias=True)
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, E, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32).repeat(E, 1)))
        self.D = nn.Parameter(torch.ones(E))
        self.dt_layernorm, self.B_layernorm, self.C_layernorm = (_RMSNorm(w, p.norm_eps) for w in (R, N, N))
        self.pre_avg_layernorm1, self.pre_avg_layernorm2 = _RMSNorm(E, p.norm_eps), _RMSNorm(E, p.norm_eps)
        self.out_proj = nn.Linear(E, dim, bias=False)
        self._init_ssm()
        if p.kv_reuse:
            self.kv_from: KVLink | None = None  # set by the compiler: the producer's link
        else:
            self.kv_source: KVLink | None = None  # set by the compiler where a consumer reads this layer

    @torch.no_grad()
    def _init_ssm(self) -> None:
        """mamba-ssm's: dt_proj's weight uniform in +-dt_rank^-0.5, softplus(its bias) log-uniform in
        [DT_MIN, DT_MAX] (madsl's Mamba's constants); A_log and D kept out of weight decay."""
        std = self.dt_rank**-0.5 * MambaLayer.DT_SCALE
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        low, high = math.log(MambaLayer.DT_MIN), math.log(MambaLayer.DT_MAX)
        dt = torch.exp(torch.rand(self.d_inner) * (high - low) + low).clamp(min=MambaLayer.DT_INIT_FLOOR)
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus of this is dt
        self.dt_proj.bias._no_reinit = True
        self.A_log._no_weight_decay = True
        self.D._no_weight_decay = True

    # ---- the parts ------------------------------------------------------------------------------
    def _rows(self, projected: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor, Tensor]:
        """q, k, v, x, z from in_proj's output (k, v None in a consumer)."""
        q_width, E = self.heads * self.qk_head_dim, self.d_inner
        if self.kv_reuse:
            q, x, z = projected.split([q_width, E, E], dim=-1)
            return q, None, None, x, z
        kv = self.kv_heads
        return tuple(projected.split([q_width, kv * self.qk_head_dim, kv * self.v_head_dim, E, E], dim=-1))

    def _ssm_inputs(self, x_conv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dt, B, C = self.x_proj(x_conv).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return self.dt_layernorm(dt), self.B_layernorm(B), self.C_layernorm(C)

    def _scan(self, x_conv: Tensor, z: Tensor, last_state: bool) -> tuple[Tensor, Tensor | None]:
        """S (B, L, E) and, where asked, the scan's last state, over (B, L, E) inputs (Mamba's forward)."""
        dt, B, C = self._ssm_inputs(x_conv)
        dt = F.linear(dt, self.dt_proj.weight)  # its bias is added inside the scan
        y, h = mamba_scan(x_conv, dt, B, C, z, self.A_log, self.D, self.dt_proj.bias, last_state)
        return y.to(x_conv.dtype), h

    def _rotate(self, t: Tensor, positions: Tensor) -> Tensor:
        return rotate(t, positions, self.rope_theta) if self.rotary else t

    def _mask(self, queries: int, keys: int, device: torch.device) -> Tensor | None:
        """(queries, keys) bool: the last `queries` of `keys` positions as queries; None where the mask is
        causal alone (or, for one query, nothing)."""
        if self.window is None or self.window >= keys:
            return None
        key = torch.arange(keys, device=device)
        query = key[keys - queries :, None]
        back = query - key[None, :]
        return (back >= 0) & ((back < self.window) | (key[None, :] < self.sinks))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q k^T / sqrt(dq)) v over (B, H, Lq, dq), (B, KV, Lk, dq), (B, KV, Lk, dv) -> (B, H, Lq, dv);
        causal where there is no mask and Lq > 1."""
        width = max(self.qk_head_dim, self.v_head_dim)
        q, k = (F.pad(t, (0, width - self.qk_head_dim)) for t in (q, _repeat_heads(k, self.groups)))
        v = F.pad(_repeat_heads(v, self.groups), (0, width - self.v_head_dim))
        causal = mask is None and q.shape[2] > 1
        y = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.qk_head_dim**-0.5)
        return y[..., : self.v_head_dim]

    def _shared(self, batch: int, length: int | None) -> tuple[Tensor, Tensor]:
        """A consumer's keys and values: its producer's, from the link (`length` None: any, in step)."""
        link = getattr(self, "kv_from", None)
        if link is None or link.value is None:
            raise RuntimeError(
                "Hb with kv_reuse reads the keys and values of an earlier Hb layer without it: build it inside "
                "a model (the compiler links them), or give it a KVLink (layer.kv_from) that a producer "
                "(layer.kv_source) fills before each call"
            )
        k, v = link.value
        want_k = (batch, self.kv_heads, k.shape[2] if length is None else length, self.qk_head_dim)
        if tuple(k.shape) != want_k or tuple(v.shape) != want_k[:3] + (self.v_head_dim,):
            raise RuntimeError(
                f"Hb with kv_reuse reads keys {want_k} and values {want_k[:3] + (self.v_head_dim,)} from its "
                f"producer, got {tuple(k.shape)} and {tuple(v.shape)}: a producer of other heads or widths"
            )
        return k, v

    def _fuse(self, attention: Tensor, ssm: Tensor) -> Tensor:
        return self.out_proj((self.pre_avg_layernorm1(attention) + self.pre_avg_layernorm2(ssm)) / 2)

    # ---- parallel (training) form ---------------------------------------------------------------
    def forward(self, u: Tensor) -> Tensor:
        """u: (B, L, dim) -> (B, L, dim), causal."""
        return self._run(u, last_state=False)[0]

    def prefill(self, u: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The parallel forward and the state `step` continues from."""
        return self._run(u, last_state=True)

    def _run(self, u: Tensor, last_state: bool) -> tuple[Tensor, dict[str, Tensor] | None]:
        batch, length, _ = u.shape
        q, k, v, x, z = self._rows(self.in_proj(u))
        x_conv = self._causal_conv_silu(x)
        s, h = self._scan(x_conv, z, last_state)
        positions = torch.arange(length, device=u.device)
        q = self._rotate(q.view(batch, length, self.heads, self.qk_head_dim), positions).transpose(1, 2)
        if self.kv_reuse:
            k, v = self._shared(batch, length)
        else:
            k = self._rotate(k.view(batch, length, self.kv_heads, self.qk_head_dim), positions).transpose(1, 2)
            v = v.view(batch, length, self.kv_heads, self.v_head_dim).transpose(1, 2)
            if self.kv_source is not None:
                self.kv_source.value = (k, v)
        a = self._attend(q, k, v, self._mask(length, length, u.device))
        y = self._fuse(a.transpose(1, 2).reshape(batch, length, self.d_inner), s)
        if not last_state:
            return y, None
        state = {
            "fixed": h.to(u.dtype),
            "conv": F.pad(x.transpose(1, 2), (self.d_conv - 1, 0))[..., length:],  # the last d_conv - 1 inputs
            "pos": torch.full((batch,), length, dtype=torch.long, device=u.device),
        }
        if not self.kv_reuse:
            state["k"], state["v"] = k, v
        return y, state

    # ---- recurrent (inference) form -------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        device = device if device is not None else weight.device
        dtype = dtype if dtype is not None else weight.dtype
        E = self.d_inner
        state = {
            "fixed": torch.zeros(batch, E, self.d_state, device=device, dtype=dtype),
            "conv": torch.zeros(batch, E, self.d_conv - 1, device=device, dtype=dtype),
            "pos": torch.zeros(batch, dtype=torch.long, device=device),
        }
        if not self.kv_reuse:
            state["k"] = torch.zeros(batch, self.kv_heads, 0, self.qk_head_dim, device=device, dtype=dtype)
            state["v"] = torch.zeros(batch, self.kv_heads, 0, self.v_head_dim, device=device, dtype=dtype)
        return state

    def _scan_step(self, x_conv: Tensor, z: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """One token of the scan (Mamba's step): S (B, E) and the new state (B, E, N)."""
        dt, B, C = self._ssm_inputs(x_conv)
        dt = F.softplus(self.dt_proj(dt))
        A = -torch.exp(self.A_log.to(dt.dtype))
        h = torch.exp(dt.unsqueeze(-1) * A) * h + (dt * x_conv).unsqueeze(-1) * B.unsqueeze(1)
        y = (h * C.unsqueeze(1)).sum(-1) + self.D.to(dt.dtype) * x_conv
        return y * F.silu(z), h

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """One token: u_t (B, dim) -> (y_t (B, dim), new state). The input state is not modified."""
        batch = u_t.shape[0]
        q, k, v, x, z = self._rows(self.in_proj(u_t))
        window = torch.cat([state["conv"], x.unsqueeze(-1)], dim=-1)  # (B, E, d_conv)
        x_conv = F.silu((window * self.conv1d.weight[:, 0, :]).sum(-1) + self.conv1d.bias)
        s, h = self._scan_step(x_conv, z, state["fixed"])
        pos = state["pos"][:, None]
        q = self._rotate(q.view(batch, 1, self.heads, self.qk_head_dim), pos).transpose(1, 2)
        new = {"fixed": h, "conv": window[..., 1:], "pos": state["pos"] + 1}
        if self.kv_reuse:
            keys, values = self._shared(batch, None)
        else:
            k = self._rotate(k.view(batch, 1, self.kv_heads, self.qk_head_dim), pos).transpose(1, 2)
            keys = torch.cat((state["k"], k), dim=2)
            values = torch.cat((state["v"], v.view(batch, self.kv_heads, 1, self.v_head_dim)), dim=2)
            new["k"], new["v"] = keys, values
            if self.kv_source is not None:
                self.kv_source.value = (keys, values)
        a = self._attend(q, keys, values, self._mask(1, keys.shape[2], u_t.device))
        return self._fuse(a.reshape(batch, self.d_inner), s), new
