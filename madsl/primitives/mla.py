"""Multi-head latent attention (`MLA`; DeepSeek-V2, DeepSeek-AI 2024; Kimi Linear's full-attention layers).

Keys and values come from one low-rank latent per token: the projection kv_a maps the input to a
latent c_t of kv_lora_rank channels (RMSNorm'd) and a rotary key k^R_t of qk_rope_head_dim channels
shared by every head; kv_b maps the latent to each head's key part k^C (qk_nope_head_dim) and value
(v_head_dim). Queries come from the input directly (q_lora_rank null: q_proj) or through a
low-rank bottleneck of q_lora_rank channels with an RMSNorm (q_a, q_b). Each head's query is
[q^C, q^R] (qk_nope_head_dim + qk_rope_head_dim), its key [k^C, k^R]; rotary rotates the q^R and
k^R parts; softmax scale 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim).

    q       = q_proj(x)  or  q_b(rmsnorm(q_a(x)))                  heads x (nope + rope)
    c, k^R  = split(kv_a(x));  c = rmsnorm(c)                      kv_lora_rank, rope (one head)
    k^C, v  = split(kv_b(c))                                       heads x (nope + v_head_dim)
    out     = o_proj(softmax([q^C, rot(q^R)] . [k^C, rot(k^R)]) v)

NoPE (`rotary: false`; Kimi Linear's mla_use_nope): the same layer with no rotary embedding; the
rope part of q and k is still projected and attended, unrotated.

Layout of transformers' DeepseekV3Attention / KimiLinearAttention (the names above are theirs):
q_a_proj and kv_a_proj_with_mqa (and o_proj) carry a bias where `bias` (attention_bias), kv_b_proj
and q_b_proj / q_proj never do; the two RMSNorms have a weight each (q_lora_rank, kv_lora_rank).

Defaults (stdlib): 4 heads with DeepSeek-V2's ratios at the MAD width: key part 32, rope part 16
(half of it, as 128 / 64), values 32, latent 128 (4 x the head dim, as 512 = 4 x 128), queries
without a bottleneck (DeepSeek-V2-Lite's and Kimi Linear's q_lora_rank null).

State: the KV cache holds the latent and the rotary key of every past token, kv_lora_rank +
qk_rope_head_dim numbers per token (DeepSeek-V2's (d_c + d_h^R) l per layer): keys and values are
recomputed from it. FLOPs (parallel form; kv_b runs once per token): projections 2LD(H(n + r))
(or 2L(D q_lora + q_lora H(n + r))), 2LD(c + r), 2LcH(n + v); attention 2L^2 H(n + r) (q.k)
+ 2L^2 H v (p.v) + the softmax 2HL^2; out 2LHvD. The RMSNorms (elementwise) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, positive


@dataclass(frozen=True)
class MLA(Primitive):
    heads: int
    q_lora_rank: int | None  # None: q_proj from the input; a rank: q_a, RMSNorm, q_b
    kv_lora_rank: int  # the latent per token (what the KV cache keeps, with the rope key)
    qk_nope_head_dim: int  # each head's key / query part read from the latent
    qk_rope_head_dim: int  # the rotary part, one key head shared by every head
    v_head_dim: int
    rotary: bool  # false: NoPE (Kimi Linear), the rope part unrotated
    rotary_base: float
    bias: bool  # transformers' attention_bias: on q_a_proj (or none), kv_a_proj_with_mqa and o_proj

    name = "mla"
    role = "sequence"
    module = "madsl.layers.mla:MLA"

    def validate(self) -> None:
        positive(self, "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if self.rotary_base <= 0:
            raise ConfigError("rotary_base", "mla: rotary_base must be positive")
        if self.rotary and self.qk_rope_head_dim % 2:
            raise ConfigError(
                "qk_rope_head_dim",
                f"mla: rotary needs an even qk_rope_head_dim, got {self.qk_rope_head_dim}",
                "an even number, or rotary=false (NoPE)",
            )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def _query_params(self) -> int:
        D, width = self.dim, self.heads * self.qk_head_dim
        if self.q_lora_rank is None:
            return D * width
        rank = self.q_lora_rank
        return D * rank + (rank if self.bias else 0) + rank + rank * width  # q_a, its norm, q_b

    def params(self) -> int:
        D, H, c, r = self.dim, self.heads, self.kv_lora_rank, self.qk_rope_head_dim
        kv_a = D * (c + r) + ((c + r) if self.bias else 0)
        kv_b = c * H * (self.qk_nope_head_dim + self.v_head_dim)
        out = H * self.v_head_dim * D + (D if self.bias else 0)
        return self._query_params() + kv_a + c + kv_b + out  # c: the latent's RMSNorm

    def kv_cache(self, seq_len: int) -> int:
        return (self.kv_lora_rank + self.qk_rope_head_dim) * seq_len

    def flops(self, seq_len: int) -> int:
        L, D, H, c, r = seq_len, self.dim, self.heads, self.kv_lora_rank, self.qk_rope_head_dim
        width = H * self.qk_head_dim
        query = 2 * L * D * width if self.q_lora_rank is None else 2 * L * self.q_lora_rank * (D + width)
        latent = 2 * L * D * (c + r) + 2 * L * c * H * (self.qk_nope_head_dim + self.v_head_dim)
        attention = 2 * L * L * H * (self.qk_head_dim + self.v_head_dim)
        out = 2 * L * H * self.v_head_dim * D
        return query + latent + attention + out + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The softmax, 2 H L^2."""
        return 2 * self.heads * seq_len * seq_len
