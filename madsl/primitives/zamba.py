"""Zamba2's shared transformer block, one use of it (`Zs`; Zyphra's Zamba2, transformers' Zamba2HybridLayer).

A Zamba2 hybrid layer i runs one of a few shared attention + MLP blocks on the residual stream h
concatenated with the model's token embeddings e, and hands the result, through a projection of its
own, to its Mamba-2 layer. This primitive is that block and that projection, one use of it:

    x   = RMSNorm_2D(concat(h, e))                                       the input norm over 2D channels
    a   = o(attn(q x + qA(x), k x + kA(x), v x + vA(x)))                 scale (head_dim / 2)^-0.5; no residual
    g, u = chunk(gate_up(RMSNorm_D(a)) + gate_upA(RMSNorm_D(a)), 2)
    f   = down(act(g) * u)                                               no residual
    z   = W f                                                            the use's own Linear(D, D), no bias

(the language adds z to h before the Mamba-2 layer: out = h + Mamba2(RMSNorm(h + z))). The shared core
is the two norms, q, k, v, o, gate_up and down (with their biases); each use has its own W and
adapters, each a Linear(in, adapter_rank) then a Linear(adapter_rank, out), both without bias: gate_upA
always, qA, kA and vA with `qkv_adapters` (Zamba2's use_shared_attention_adapter). An adapter's output
is its projection's width: q heads x head_dim, k and v kv_heads x head_dim (transformers builds them 2D
wide, the same where it is well-formed: head_dim 2D / heads and no grouped keys). Rotary embeddings on
q and k (rotate-half, over the whole head) with `rope` (use_mem_rope); grouped-query attention by
`kv_heads`; head_dim null: 2 D / heads (Zamba2's attention_head_dim). act: exact-erf GELU (Zamba2's
"gelu"), its tanh approximation, or SiLU; `bias`: gate_up and down carry biases (add_bias_linear).

Defaults (stdlib): 4 heads (head_dim 64 at width 128), ffn 4 x dim (Zamba2's intermediate_size
default), adapter_rank 16, no q/k/v adapters, no rotary (theta 10000), exact GELU, no bias, eps 1e-5.
Zamba2Config's defaults (its 2.7B-style configuration) differ in width (2560, 32 heads of 160) and
adapter_rank (128).

Parameters (D = dim, Q = heads x head_dim, K = kv_heads x head_dim, F = ffn, r = adapter_rank), one use
all told: the core 3D (norms) + 2D (Q + 2K) + Q D + 3 D F [+ 2F + D with bias], and the per-use parts
(`per_use_params`, what each further use of a tagged Zs adds): D^2 + r (D + 2F) [+ r (6D + Q + 2K)
with qkv_adapters].
State: the KV cache of every past token, 2 K numbers per token (as attention's).
FLOPs: projections 4 L D (Q + 2K), attention 4 L^2 Q (q.k and p.v) + softmax 2 H L^2, o 2 L Q D,
MLP 6 L D F, W 2 L D^2, adapters 2 L r (D + 2F) [+ 2 L r (6D + Q + 2K)]; norms, the activation and the
sums are not counted (as attention's and the MLP's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import ConfigError, KeyValueHeads, Primitive, divides, positive


@dataclass(frozen=True)
class ZambaShared(KeyValueHeads, Primitive):
    heads: int
    kv_heads: int | None  # key/value heads (grouped-query attention); None: heads
    head_dim: int | None  # None: 2 * dim // heads (Zamba2's attention_head_dim: the input is 2 * dim wide)
    ffn: int  # the MLP's inner width (Zamba2's intermediate_size)
    adapter_rank: int  # the rank of every adapter (Zamba2's adapter_rank)
    qkv_adapters: bool  # adapters on q, k and v too (Zamba2's use_shared_attention_adapter)
    rope: bool  # rotary embeddings on q and k (Zamba2's use_mem_rope)
    rope_theta: float
    activation: Literal["gelu", "gelu_tanh", "silu"]  # gelu: exact (erf), Zamba2's hidden_act default
    bias: bool  # biases on gate_up and down (Zamba2's add_bias_linear)
    norm_eps: float  # both inner RMSNorms' epsilon (Zamba2's rms_norm_eps)

    name = "zamba_shared"
    role = "sequence"
    module = "madsl.layers.zamba:ZambaShared"

    def validate(self) -> None:
        positive(self, "heads", "kv_heads", "head_dim", "ffn", "adapter_rank")
        if self.head_dim is None:
            divides(self, "heads", self.heads, 2 * self.dim, "2 x dim (the concatenated input)")
        if self.kv_heads is not None:
            divides(self, "kv_heads", self.kv_heads, self.heads, "heads")
        if self.rope_theta <= 0:
            raise ConfigError("rope_theta", f"zamba_shared: rope_theta must be positive, got {self.rope_theta}")
        if self.norm_eps <= 0:
            raise ConfigError("norm_eps", f"zamba_shared: norm_eps must be positive, got {self.norm_eps}")
        if self.rope and self.inner_head_dim % 2:
            raise ConfigError(
                "head_dim",
                f"zamba_shared: rotary embeddings need an even head_dim, got {self.inner_head_dim}",
                "set rope=false or an even head_dim",
            )

    @property
    def inner_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else 2 * self.dim // self.heads

    @property
    def inner(self) -> int:
        """The queries' width: heads x head_dim."""
        return self.heads * self.inner_head_dim

    @property
    def kv_inner(self) -> int:
        """The keys' (and the values') width: kv_heads x head_dim."""
        return self.key_value_heads * self.inner_head_dim

    @property
    def scale(self) -> float:
        """The softmax scale of q.k: (head_dim / 2)^-0.5 (Zamba2's, for a head of the 2D-wide input)."""
        return (self.inner_head_dim / 2) ** -0.5

    @property
    def projected(self) -> int:
        return self.inner + 2 * self.kv_inner

    def _core(self) -> int:
        D, F = self.dim, self.ffn
        norms = 2 * D + D
        attention = 2 * D * self.projected + self.inner * D
        mlp = 3 * D * F + ((2 * F + D) if self.bias else 0)
        return norms + attention + mlp

    def _adapter_widths(self) -> int:
        """Inputs + outputs of every adapter: each holds rank x (in + out) weights."""
        qkv = (3 * 2 * self.dim + self.projected) if self.qkv_adapters else 0
        return self.dim + 2 * self.ffn + qkv

    def per_use_params(self) -> int:
        return self.dim * self.dim + self.adapter_rank * self._adapter_widths()

    def params(self) -> int:
        return self._core() + self.per_use_params()

    def kv_cache(self, seq_len: int) -> int:
        return 2 * self.kv_inner * seq_len

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        projections = 2 * L * (2 * D) * self.projected + 2 * L * self.inner * D
        attention = 4 * L * L * self.inner
        mlp = 6 * L * D * self.ffn
        per_use = 2 * L * D * D + 2 * L * self.adapter_rank * self._adapter_widths()
        return projections + attention + mlp + per_use + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The softmax, 2 H L^2."""
        return 2 * self.heads * seq_len * seq_len
