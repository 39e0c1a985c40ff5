"""Multi-head causal self-attention (`A`, `mA`): the torch module of `madsl.primitives.attention`.

    q, k, v = split(qkv(x))                  one fused projection dim -> (heads + 2 kv_heads) x head_dim
    q, k    = rmsnorm(q), rmsnorm(k)         optional (qk_norm): over head_dim, one weight for all heads
    q, k    = rotary(q), rotary(k)           optional; rotate-half convention (GPT-NeoX / Llama), on the
                                             first rotary_fraction * head_dim channels of each head
    out     = out(softmax(q k^T / sqrt(head_dim) + causal mask) v [* sigmoid(gate)])
                                             gate: optional (output_gate), heads x head_dim more outputs
                                             of the fused projection (Qwen3-Next's doubled q_proj)

Grouped-query attention (kv_heads < heads): k and v have kv_heads heads; each is repeated
for its heads / kv_heads query heads just before SDPA (query head h reads key/value head
h // groups, as Hugging Face's repeat_kv), so the cache keeps kv_heads heads only.

Attention runs through `torch.nn.functional.scaled_dot_product_attention`, which picks
its fused backend itself: on CUDA flash attention for bf16/fp16 (under autocast) and
the memory-efficient kernel for fp32; on the CPU its flash kernel. All of them keep the
softmax statistics (row max and sum) in float32. Under vmap (grid-batched training) the
members fold into SDPA's batch axis: one call for all of them (`madsl.kernels.attention`).
Step mode keeps a growing KV cache: state
{"k": (B, kv_heads, T, head_dim), "v": (B, kv_heads, T, head_dim), "pos": (B,) int64}, so
k and v together hold the accounting's kv_cache(T) numbers per sequence; "pos" is
the position of the next token (what rotary needs; it equals T).

Sliding window (`window` w): the parallel form masks keys more than w - 1 tokens back
(a banded causal mask); step mode keeps a ring buffer of the last w keys and values:
the cache grows to w tokens, then token T overwrites slot T mod w. Keys are rotated
before they are cached, so each carries its own position, and softmax does not depend
on the order of the slots.

Init (as the MAD reference, whose attention is flash-attn's MHA inside a language
model that zeroes every Linear bias): PyTorch's default Linear init for the weights
(kaiming-uniform, bound 1/sqrt(fan_in)), biases zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.attention import scaled_dot_product_attention
from madsl.primitives.attention import Attention as AttentionPrimitive


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x rotated on its first cos.shape[-1] channels (all of them, or a partial rotary's part)."""
    width = cos.shape[-1]
    if width == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    rotated, kept = x[..., :width], x[..., width:]
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, kept), dim=-1)


def _repeat_heads(x: Tensor, groups: int) -> Tensor:
    """(B, kv_heads, T, hd) -> (B, kv_heads * groups, T, hd), each key/value head repeated for
    its consecutive query heads. (SDPA's enable_gqa does the same, but not under vmap.)"""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class Attention(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: AttentionPrimitive):
        super().__init__()
        self.dim = p.dim
        self.heads = p.heads
        self.kv_heads = p.key_value_heads
        self.groups = p.groups
        self.head_dim = p.inner_head_dim
        self.rotary = p.rotary
        self.rotary_base = float(p.rotary_base)
        self.rotary_dim = p.rotary_dim
        self.window = p.window
        self.scale = p.scale  # None: SDPA's 1 / sqrt(head_dim)
        self.gated = p.output_gate
        self.qkv = nn.Linear(p.dim, p.projected, bias=p.bias)
        self.out = nn.Linear(p.inner, p.dim, bias=p.has_out_bias)
        self.q_norm = nn.RMSNorm(p.inner_head_dim, eps=p.qk_norm_eps) if p.qk_norm else None
        self.k_norm = nn.RMSNorm(p.inner_head_dim, eps=p.qk_norm_eps) if p.qk_norm else None
        # cos/sin tables of the rotary embedding, grown on demand (no parameters, not saved).
        self._rotary_cache: tuple[Tensor, Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for linear in (self.qkv, self.out):
            linear.reset_parameters()
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def _rotary_tables(self, length: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin of shape (>= length, rotary_dim) in `like`'s dtype and device. `like` is q:
        under autocast the rotated q, k must keep v's dtype, since SDPA under vmap (stacked
        grid training) does not cast its inputs as autocast does."""
        cache = self._rotary_cache
        if (
            cache is None
            or cache[0].shape[0] < length
            or cache[0].device != like.device
            or cache[0].dtype != like.dtype
        ):
            # Round the length up so that step mode does not rebuild the table every token.
            size = max(256, 1 << (length - 1).bit_length())
            precision = torch.float64 if like.dtype == torch.float64 else torch.float32
            exponents = torch.arange(0, self.rotary_dim, 2, device=like.device, dtype=precision) / self.rotary_dim
            inv_freq = self.rotary_base**-exponents
            angles = torch.outer(torch.arange(size, device=like.device, dtype=precision), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)  # rotate-half pairs channel i with i + rotary_dim/2
            cache = (angles.cos().to(like.dtype), angles.sin().to(like.dtype))
            self._rotary_cache = cache
        return cache

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        return self.prefill(x)[0]

    def prefill(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The parallel forward and the KV cache `step` continues from."""
        batch, length, _ = x.shape
        q, k, v, gate = self._project(self.qkv(x).view(batch, length, -1, self.head_dim).transpose(1, 2))
        if self.rotary:
            cos, sin = self._rotary_tables(length, q)
            cos, sin = cos[:length], sin[:length]
            q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        keys, values = _repeat_heads(k, self.groups), _repeat_heads(v, self.groups)
        if self.window is None or self.window >= length:
            y = scaled_dot_product_attention(
                q, keys, values, is_causal=True, scale=self.scale
            )  # (B, heads, L, head_dim)
        else:
            back = torch.arange(length, device=x.device)
            back = back[:, None] - back[None, :]  # query position - key position
            band = (back >= 0) & (back < self.window)
            y = scaled_dot_product_attention(q, keys, values, attn_mask=band, scale=self.scale)
        if gate is not None:
            y = y * torch.sigmoid(gate)
        y = self.out(y.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))
        pos = torch.full((batch,), length, dtype=torch.long, device=x.device)
        if self.window is not None and length > self.window:
            # the ring buffer `step` keeps: position p in slot p % window
            k, v = (torch.roll(t[:, :, -self.window :], length % self.window, dims=2) for t in (k, v))
        return y, {"k": k, "v": v, "pos": pos}

    def _project(self, heads: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """q (B, heads, T, hd), k and v (B, kv_heads, T, hd) and the output gate (as q, or None) from
        the fused projection's (B, heads + 2 kv_heads [+ heads], T, hd); q and k normalised where qk_norm."""
        sizes = (self.heads, self.kv_heads, self.kv_heads) + ((self.heads,) if self.gated else ())
        q, k, v, *gate = heads.split(sizes, dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, (gate[0] if gate else None)

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        dtype = dtype if dtype is not None else self.out.weight.dtype
        device = device if device is not None else self.out.weight.device
        empty = torch.zeros(batch, self.kv_heads, 0, self.head_dim, device=device, dtype=dtype)
        return {"k": empty, "v": empty.clone(), "pos": torch.zeros(batch, dtype=torch.long, device=device)}

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        batch = x_t.shape[0]
        q, k, v, gate = self._project(self.qkv(x_t).view(batch, -1, 1, self.head_dim))  # (B, heads or kv_heads, 1, hd)
        pos = state["pos"]
        if self.rotary:
            # positions run past the cache size once a window's ring buffer is full
            seen = state["k"].shape[2] + 1 if self.window is None else int(pos.max()) + 1
            cos, sin = self._rotary_tables(seen, q)
            cos, sin = cos[pos][:, None, None], sin[pos][:, None, None]  # (B, 1, 1, rotary_dim)
            q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        cached = state["k"].shape[2]
        if self.window is None or cached < self.window:
            keys = torch.cat((state["k"], k), dim=2)
            values = torch.cat((state["v"], v), dim=2)
        else:  # the ring buffer is full: the new token takes the oldest one's slot
            slot = (pos % self.window).view(batch, 1, 1, 1).expand(batch, self.kv_heads, 1, self.head_dim)
            # the cache keeps its dtype (under autocast k, v are the projections' bf16)
            keys = state["k"].scatter(2, slot, k.to(state["k"].dtype))
            values = state["v"].scatter(2, slot, v.to(state["v"].dtype))
        # The new token attends to every cached one: no mask (is_causal would align top-left).
        y = F.scaled_dot_product_attention(
            q, _repeat_heads(keys, self.groups), _repeat_heads(values, self.groups), scale=self.scale
        )  # (B, heads, 1, head_dim)
        if gate is not None:
            y = y * torch.sigmoid(gate)
        out = self.out(y.reshape(batch, self.heads * self.head_dim))
        return out, {"k": keys, "v": values, "pos": pos + 1}
