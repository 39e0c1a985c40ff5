"""mLSTM (`mL`; xLSTM, Beck et al. 2024, §2.3): a matrix memory with exponential input gates.

Per head, with input gate exp(i~_t), forget gate sigmoid(f~_t) (both scalars per head and token,
from the input) and output gate o_t = sigmoid(W_o x_t):

    C_t = f_t C_{t-1} + i_t k_t v_t^T,   n_t = f_t n_{t-1} + i_t k_t,
    h_t = o_t * (C_t^T q_t / (max(|n_t . q_t|, 1) + eps))

computed stabilised (the paper's eqs. 15-17 and 25-27): a stabiliser m_t = max(log f_t + m_{t-1},
i~_t) rescales C and n so that no exponential overflows; the result is the same.

Layout (the mLSTM cell of the paper, as xLSTM's reference `mLSTMCell` parametrises it):
q_proj, k_proj dim -> heads * qk_head_dim, v_proj dim -> heads * head_dim (k scaled by
qk_head_dim^-0.5); igate, fgate dim -> heads (with bias); o_proj dim -> heads * head_dim; a per-head
LayerNorm of h (weight heads * head_dim; xLSTM's MultiHeadLayerNorm); out_proj -> dim. The original
mLSTM block's up-projection and short conv around the cell are left out: `mL` is the cell as a
sequence mixer, next to the other mixers of this library.
Defaults: 4 heads (xLSTM's mLSTM default), head_dim null = dim / heads, queries and keys as wide as
values, no biases, no gate cap, the stabiliser starting at -inf (nothing seen), eps 0.

xLSTM-7B's mLSTM layer (NX-AI's xLSTM-7b; transformers' xLSTMLayer, weight_mode "single") is this
layer with its options: qk_head_dim = head_dim / 2 (qk_dim_factor 0.5: 8 heads, query/key heads of
256 and value heads of 512 at width 4096), `gate_soft_cap` 15 (i~ and f~ soft-capped, cap *
tanh(x / cap), before the gates), `bias` (its use_bias: q, k, v, the output gate, the norm and
out_proj get biases; false in xLSTM-7B), `norm_eps` 1e-6, and its kernels' numerics:
`zero_stabilizer` (the stabiliser starts at m_0 = 0, xLSTM's zero initial state, so the lower
bound exp(-m_t) of the normaliser is at most exp(-sum log f)) and `eps` 1e-6 added to the
normaliser. xLSTM-7B's block around it is a pre-norm residual mLSTM layer followed by a pre-norm
residual SwiGLU (its up-projection, of width round_up(2.667 dim, 64)): `mL{...}-SwiGLU{...}`
with `norm: rms` (docs/language.md).

State: the memory C (heads * qk_head_dim * head_dim), the normaliser n (heads * qk_head_dim) and the
stabiliser m (heads): 4 * (32 * 32 + 32 + 1) = 4228 at width 128. All three are carried
from token to token, so all three count.
FLOPs (recurrent form): projections 2LD(2 H qk + 2 H hd + 2H), memory update and readout
6LH qk hd (decay, outer product, readout), normaliser 6LH qk, out 2LH hd D.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Heads, Primitive, positive


@dataclass(frozen=True)
class MLSTM(Heads, Primitive):
    heads: int
    head_dim: int | None  # None: dim // heads (the value heads' width)
    qk_head_dim: int | None  # None: head_dim; xLSTM-7B: head_dim / 2
    gate_soft_cap: float | None  # None: none; xLSTM-7B: 15
    bias: bool  # biases of q, k, v, the output gate, the norm and out_proj (xLSTM's use_bias)
    norm_eps: float  # the per-head LayerNorm's epsilon
    zero_stabilizer: bool  # m_0 = 0 (xLSTM's kernels' zero initial state); false: -inf, nothing seen
    eps: float  # added to the normaliser max(|n . q|, exp(-m)) (xLSTM's kernels: 1e-6)

    name = "mlstm"
    role = "sequence"
    module = "madsl.layers.mlstm:MLSTM"
    # added later (xLSTM-7B's layer): specs at their defaults keep their run identities
    identity_omits = ("qk_head_dim", "gate_soft_cap", "bias", "norm_eps", "zero_stabilizer", "eps")

    def validate(self) -> None:
        self.validate_heads()
        positive(self, "qk_head_dim")
        cap = self.gate_soft_cap
        if cap is not None and not cap > 0:
            raise ConfigError("gate_soft_cap", f"mlstm: gate_soft_cap must be > 0 (null: none), got {cap}")
        if not self.norm_eps > 0:
            raise ConfigError("norm_eps", f"mlstm: norm_eps must be > 0, got {self.norm_eps}")
        if not self.eps >= 0:
            raise ConfigError("eps", f"mlstm: eps must be >= 0, got {self.eps}")

    @property
    def key_head_dim(self) -> int:
        """The width of each head's queries and keys (the memory's rows)."""
        return self.qk_head_dim or self.inner_head_dim

    @property
    def key_inner(self) -> int:
        return self.heads * self.key_head_dim

    def params(self) -> int:
        D, H, inner, keys = self.dim, self.heads, self.inner, self.key_inner
        biases = 2 * keys + 3 * inner + D if self.bias else 0  # q, k; v, o, norm; out_proj
        return 2 * D * keys + 2 * D * inner + 2 * (D * H + H) + inner + inner * D + biases

    def fixed_state(self) -> int:
        K, V = self.key_head_dim, self.inner_head_dim
        return self.heads * (K * V + K + 1)

    def flops(self, seq_len: int) -> int:
        L, D, H, K, V = seq_len, self.dim, self.heads, self.key_head_dim, self.inner_head_dim
        return 2 * L * D * (2 * H * K + 2 * H * V + 2 * H) + self.non_matmul_flops(L) + 2 * L * H * V * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """The memory 6 L H qk hd and the normaliser 6 L H qk (the recurrent form)."""
        L, H, K, V = seq_len, self.heads, self.key_head_dim, self.inner_head_dim
        return 6 * L * H * K * V + 6 * L * H * K
