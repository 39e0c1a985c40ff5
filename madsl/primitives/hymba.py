"""Hymba's hybrid-head mixer (`Hb`; NVIDIA's Hymba, Dong et al. 2024, `HymbaBlock` of Hymba-1.5B's
modeling_hymba.py): attention heads and a Mamba-1 SSM side by side on one fused input projection, their
outputs normalised, averaged and projected back by one output projection.

    P = in_proj(u)          rows [q (H dq) | k (KV dq) | v (KV dv) | x (E) | z (E)]; a KV consumer: [q | x | z]
    SSM:  x_c = silu(causal depthwise conv(x) + bias); [dt | B | C] = x_proj(x_c); dt, B, C each RMSNormed;
          delta = softplus(dt_proj(dt) + dt_bias); h_t = exp(delta A) h + delta B x_c (A = -exp(A_log));
          S = (C.h + D x_c) * silu(z)                                          (Mamba-1, Jamba's inner norms)
    Attn: rotary (rotate-half) on Q and K; query head h reads key/value head h // (H / KV); softmax(Q K^T /
          sqrt(dq)) V under the mask -> A (H dv = E wide)
    out = out_proj((RMSNorm_E(A) w1 + RMSNorm_E(S) w2) / 2)

Mask: causal; with `window` W a query q sees key k iff k <= q and (q - k < W or k < sinks): W positions, itself
included, and the first `sinks` positions (Hymba's meta tokens, which its model prepends; the layer only needs
their number). Hymba's flex mask q - k <= 1024 is window 1025 here.
KV sharing (`kv_reuse`): a consumer has no k/v rows; it reads the post-rotary keys and values of the nearest
earlier Hb layer without kv_reuse (the compiler links them: madsl/layers/hymba.py's KVLink).

Sizes: E = expand dim (d_inner), dq = head_dim (null: dim / heads; Hymba's q is dim wide), dv = E / heads (Hymba
overrides v_head_dim so), KV = kv_heads (null: heads), R = dt_rank (null: ceil(dim / 16)), N = d_state.
Defaults at width 128: 4 heads, expand 2, d_state 16, d_conv 4, no window, rotary base 10000, eps 1e-6 (Hymba's
rms_norm_eps, also the inner norms'). Hymba-1.5B: dim 1600, 25 heads, 5 kv_heads (dq 64, dv 128), E 3200, N 16,
R 100, d_conv 4; window 1025 with 128 sinks on 29 of its 32 layers; rope_theta 10000 x 7^(64/62) (its NTK base).

Parameters: in_proj dim (H dq [+ KV (dq + dv)] + 2E), conv1d E d_conv + E, x_proj E (R + 2N), dt_proj R E + E,
A_log E N, D E, the dt/B/C norms R + 2N, the two averaging norms 2E, out_proj E dim (Hymba has no other biases).
State: fixed E N (the scan), conv E (d_conv - 1) (mamba.py's convention); KV cache: a producer's step cache holds
the keys and values of every past token, untrimmed also with a window, kv_cache(L) = L KV (dq + dv); a
consumer's is 0 (it reads its producer's).
FLOPs (2 a multiply-add): projections 2 L dim (rows of in_proj) + 2 L E dim, conv 2 d_conv L E, x_proj 2 L E (R +
2N), dt_proj 2 L R E, scan 2 L E N (as Mamba); attention q.k 2 P H dq and p.v 2 P H dv over P = L min(L, window
+ sinks) (query, key) pairs (L^2 without a window, as attention's), softmax 2 H P; norms, rotary, gates and the
average are not counted (as attention's and Mamba's). A consumer counts its own q.k and p.v.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, KeyValueHeads, Primitive, divides, positive
from .mamba import MambaWidths


@dataclass(frozen=True)
class Hymba(KeyValueHeads, MambaWidths, Primitive):
    heads: int
    kv_heads: int | None  # key/value heads (grouped-query attention); None: heads
    head_dim: int | None  # the q/k head width; None: dim // heads (Hymba's queries are dim wide)
    expand: int  # d_inner = expand * dim: the SSM's width, and the attention output's (dv = d_inner / heads)
    d_state: int
    d_conv: int
    dt_rank: int | None  # None: ceil(dim / 16)
    window: int | None  # sliding window in positions (the current one included); None: causal attention
    sinks: int  # with a window, the first positions every query also sees (Hymba's meta tokens)
    kv_reuse: bool  # a KV consumer: no k/v rows; reads the nearest earlier Hb producer's keys and values
    rotary: bool
    rope_theta: float
    norm_eps: float  # every RMSNorm's epsilon (Hymba's rms_norm_eps)

    name = "hymba"
    role = "sequence"
    module = "madsl.layers.hymba:Hymba"

    def validate(self) -> None:
        positive(self, "heads", "kv_heads", "head_dim", "expand", "d_state", "d_conv", "dt_rank", "window")
        if self.head_dim is None:
            divides(self, "heads", self.heads, self.dim, "dim")
        divides(self, "heads", self.heads, self.d_inner, "d_inner (expand x dim: the value heads share it)")
        if self.kv_heads is not None:
            divides(self, "kv_heads", self.kv_heads, self.heads, "heads")
        if self.sinks < 0:
            raise ConfigError("sinks", f"hymba: sinks must be 0 or more, got {self.sinks}")
        if self.sinks and self.window is None:
            raise ConfigError(
                "sinks",
                "hymba: sinks are positions a windowed query sees beyond its window; without a window every "
                "query sees them already",
                "set a window, or sinks: 0",
            )
        for key in ("rope_theta", "norm_eps"):
            if not 0 < getattr(self, key) < float("inf"):
                raise ConfigError(key, f"hymba: {key} must be a positive number, got {getattr(self, key)}")
        if self.rotary and self.qk_head_dim % 2:
            raise ConfigError(
                "head_dim",
                f"hymba: rotary embeddings need an even head_dim, got {self.qk_head_dim}",
                "set rotary=false or an even head_dim",
            )

    # --- derived sizes ----------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.dim // self.heads

    @property
    def v_head_dim(self) -> int:
        return self.d_inner // self.heads

    @property
    def kv_width(self) -> int:
        """The k and v rows of a producer's in_proj, together: KV (dq + dv)."""
        return self.key_value_heads * (self.qk_head_dim + self.v_head_dim)

    @property
    def projected(self) -> int:
        """in_proj's outputs: q, [k, v,] x and z."""
        return self.heads * self.qk_head_dim + (0 if self.kv_reuse else self.kv_width) + 2 * self.d_inner

    def attended(self, seq_len: int) -> int:
        """Positions a query sees at most: the sequence, or its window and the sinks."""
        return seq_len if self.window is None else min(seq_len, self.window + self.sinks)

    # --- accounting -------------------------------------------------------------------
    def params(self) -> int:
        D, E, R, N = self.dim, self.d_inner, self.rank, self.d_state
        in_proj = D * self.projected
        conv1d = E * self.d_conv + E
        ssm = E * (R + 2 * N) + R * E + E + E * N + E  # x_proj, dt_proj (+ bias), A_log, D
        norms = R + 2 * N + 2 * E
        return in_proj + conv1d + ssm + norms + E * D

    def fixed_state(self) -> int:
        return self.d_inner * self.d_state

    def conv_state(self) -> int:
        return self.d_inner * (self.d_conv - 1)

    def kv_cache(self, seq_len: int) -> int:
        return 0 if self.kv_reuse else seq_len * self.kv_width

    def flops(self, seq_len: int) -> int:
        L, D, E, R, N = seq_len, self.dim, self.d_inner, self.rank, self.d_state
        projections = 2 * L * D * self.projected + 2 * L * E * D
        ssm = 2 * self.d_conv * L * E + 2 * L * E * (R + 2 * N) + 2 * L * R * E
        pairs = L * self.attended(L)
        attention = 2 * pairs * self.heads * (self.qk_head_dim + self.v_head_dim)
        return projections + ssm + attention + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The scan, 2 L E N, and the softmax, 2 H L min(L, window + sinks)."""
        return 2 * seq_len * self.d_inner * self.d_state + 2 * self.heads * seq_len * self.attended(seq_len)
