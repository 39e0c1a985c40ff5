"""Multi-head causal self-attention (`A`: one head; `mA`: 16 heads x 8).

Defaults: MAD paper App. B.3.2 (16 heads, head dim 8, no bias for linear layers);
rotary position embeddings as in Transformer++ (MAD paper App. C.4.1).
GPT-Neo's attention is `rotary=false, scale=1.0, out_bias=true` (learned absolute
positions are model-wide: the spec's `positions: learned`): it does not scale q.k by
1/sqrt(head_dim), and only its output projection has a bias.

Layout: a fused `qkv` projection dim -> (heads + 2*kv_heads)*head_dim and `out`
heads*head_dim -> dim. Grouped-query attention (`kv_heads`, null = heads: multi-head
attention; Ainslie et al. 2023, Llama 2/3, Mistral, Jamba, Nemotron-H): kv_heads key/value
heads, each shared by heads / kv_heads consecutive query heads (query head h reads key/value
head h // (heads / kv_heads), as Hugging Face's repeat_kv and SDPA's enable_gqa).
Sliding window (`window`, null = full attention): each token attends to itself and the
window - 1 tokens before it (flash-attn's window_size=(window - 1, 0); Mistral, Gemma).

Partial rotary (`rotary_fraction` f < 1; Bamba 0.5, GPT-NeoX, Qwen3-Next): rotary rotates the
first f * head_dim channels of each head and leaves the rest as they are (Hugging Face's
partial_rotary_factor); the frequencies are those of a head of f * head_dim channels.

Query-key norm (`qk_norm`; LFM2, Qwen3): an RMSNorm over each head's head_dim on q and on k
after the projection, before rotary (weights head_dim each, shared by the heads): 2 * head_dim
parameters; their FLOPs (elementwise) are not counted. Their epsilon is `qk_norm_eps` (1e-5;
Qwen3-Next's and Qwen3.5's rms_norm_eps, 1e-6).

Output gate (`output_gate`; Qwen3-Next's gated attention): the query projection is doubled, its
second half a gate per head and channel, and the attention output is multiplied by its sigmoid
before the output projection: dim * heads * head_dim parameters more (and a bias of that width
where `bias`), 2 * L * dim * heads * head_dim FLOPs; the sigmoid and the product (elementwise)
are not counted.

State: no fixed state; the KV cache holds keys and values of every past token,
2 * kv_heads * head_dim numbers per token (MAD paper §2.2: a dynamic state); with a
window, of the last min(L, window) tokens only: 2 * kv_heads * head_dim * min(L, window).
FLOPs: App. C.4.1 (projections 6LD^2, attention 4L^2D + 2HL^2, out layer 2LD^2),
with D replaced by heads*head_dim where the inner width differs from the model width,
and the key/value projections 2 x 2LD * kv_heads*head_dim; with a window, the L^2
(query, key) pairs become L * min(L, window).
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Heads, KeyValueHeads, Primitive, divides, positive


@dataclass(frozen=True)
class Attention(Heads, KeyValueHeads, Primitive):
    heads: int
    head_dim: int | None  # None: dim // heads
    rotary: bool
    rotary_base: float
    bias: bool
    window: int | None  # sliding window in tokens (the current one included); None: full attention
    kv_heads: int | None  # key/value heads (grouped-query attention); None: heads (multi-head attention)
    scale: float | None  # softmax scale of q.k; None: 1 / sqrt(head_dim). GPT-Neo: 1.0 (no scaling)
    out_bias: bool  # a bias on the output projection even where `bias` is false (GPT-Neo's out_proj)
    qk_norm: bool  # an RMSNorm over head_dim on q and on k (LFM2's q_layernorm / k_layernorm)
    rotary_fraction: float  # the part of each head rotary rotates (Hugging Face's partial_rotary_factor)
    output_gate: bool  # sigmoid(gate) on the output, the gate from a doubled query projection (Qwen3-Next)
    qk_norm_eps: float = 1e-5  # the q and k norms' epsilon (Qwen3-Next's rms_norm_eps, 1e-6)

    name = "attention"
    role = "sequence"
    module = "madsl.layers.attention:Attention"
    # added later: specs that leave them at their defaults keep their run identities
    identity_omits = (
        "window",
        "kv_heads",
        "scale",
        "out_bias",
        "qk_norm",
        "rotary_fraction",
        "output_gate",
        "qk_norm_eps",
    )

    def validate(self) -> None:
        positive(self, "heads", "head_dim", "window", "kv_heads", "qk_norm_eps")
        if self.scale is not None and not 0 < self.scale < float("inf"):
            raise ConfigError(
                "scale",
                f"attention: scale must be a positive number, got {self.scale}",
                "null: 1 / sqrt(head_dim); 1.0: no scaling (GPT-Neo)",
            )
        if self.rotary_base <= 0:
            raise ConfigError("rotary_base", "attention: rotary_base must be positive")
        if self.head_dim is None:
            divides(self, "heads", self.heads, self.dim, "dim")
        if not 0 < self.rotary_fraction <= 1:
            raise ConfigError(
                "rotary_fraction",
                f"attention: rotary_fraction must be in (0, 1], got {self.rotary_fraction}",
                "1.0: rotary on the whole head",
            )
        if self.rotary and (self.rotary_dim % 2 or self.rotary_dim == 0):
            raise ConfigError(
                "head_dim",
                f"attention: rotary embeddings need an even number of rotated channels, "
                f"got {self.rotary_dim} (rotary_fraction {self.rotary_fraction} of head_dim "
                f"{self.inner_head_dim})",
                "set rotary=false or an even head_dim",
            )
        if self.kv_heads is not None:
            divides(self, "kv_heads", self.kv_heads, self.heads, "heads")

    @property
    def rotary_dim(self) -> int:
        """The channels of each head that rotary rotates: int(rotary_fraction * head_dim)."""
        return int(self.rotary_fraction * self.inner_head_dim)

    @property
    def kv_inner(self) -> int:
        """Width of the keys (and of the values): key_value_heads * head_dim."""
        return self.key_value_heads * self.inner_head_dim

    @property
    def projected(self) -> int:
        """Outputs of the fused projection: q [and the output gate], k, v."""
        return self.inner * (2 if self.output_gate else 1) + 2 * self.kv_inner

    def params(self) -> int:
        projected = self.projected
        qkv = self.dim * projected + (projected if self.bias else 0)
        out = self.inner * self.dim + (self.dim if self.has_out_bias else 0)
        return qkv + out + (2 * self.inner_head_dim if self.qk_norm else 0)

    @property
    def has_out_bias(self) -> bool:
        return self.bias or self.out_bias

    def attended(self, seq_len: int) -> int:
        """Tokens a query sees at most: the whole sequence, or the window."""
        return seq_len if self.window is None else min(seq_len, self.window)

    def kv_cache(self, seq_len: int) -> int:
        return 2 * self.kv_inner * self.attended(seq_len)

    def flops(self, seq_len: int) -> int:
        L, D, inner = seq_len, self.dim, self.inner
        pairs = L * self.attended(L)
        return 2 * L * D * self.projected + 4 * pairs * inner + 2 * L * inner * D + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The softmax, 2 H L^2 (the L^2 pairs: L * min(L, window) with a window)."""
        return 2 * self.heads * seq_len * self.attended(seq_len)
