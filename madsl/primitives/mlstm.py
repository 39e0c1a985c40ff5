"""mLSTM (`mL`; xLSTM, Beck et al. 2024, §2.3): a matrix memory with exponential input gates.

Per head, with input gate exp(i~_t), forget gate sigmoid(f~_t) (both scalars per head and token,
from the input) and output gate o_t = sigmoid(W_o x_t):

    C_t = f_t C_{t-1} + i_t k_t v_t^T,   n_t = f_t n_{t-1} + i_t k_t,
    h_t = o_t * (C_t^T q_t / max(|n_t . q_t|, 1))

computed stabilised (the paper's eqs. 15-17 and 25-27): a stabiliser m_t = max(log f_t + m_{t-1},
i~_t) rescales C and n so that no exponential overflows; the result is the same.

Layout (the mLSTM cell of the paper, as xLSTM's reference `mLSTMCell` parametrises it):
q_proj, k_proj, v_proj dim -> heads * head_dim (no bias; k scaled by head_dim^-0.5); igate,
fgate dim -> heads (with bias); o_proj dim -> heads * head_dim (no bias); a per-head LayerNorm of
h (weight heads * head_dim, no bias; xLSTM's MultiHeadLayerNorm); out_proj -> dim. The mLSTM
block's up-projection and short conv around the cell are left out: `mL` is the cell as a
sequence mixer, next to the other mixers of this library.
Defaults: 4 heads (xLSTM's mLSTM default), head_dim null = dim / heads.

State: the memory C (heads * head_dim^2), the normaliser n (heads * head_dim) and the
stabiliser m (heads): 4 * (32 * 32 + 32 + 1) = 4228 at width 128. All three are carried
from token to token, so all three count.
FLOPs (recurrent form): projections 2LD(4 H hd + 2H), memory update and readout 6LH hd^2
(decay, outer product, readout), normaliser 6LH hd, out 2LH hd D.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Heads, Primitive


@dataclass(frozen=True)
class MLSTM(Heads, Primitive):
    heads: int
    head_dim: int | None  # None: dim // heads

    name = "mlstm"
    role = "sequence"
    module = "madsl.layers.mlstm:MLSTM"

    def validate(self) -> None:
        self.validate_heads()

    def params(self) -> int:
        D, H, inner = self.dim, self.heads, self.inner
        return 4 * D * inner + 2 * (D * H + H) + inner + inner * D

    def fixed_state(self) -> int:
        hd = self.inner_head_dim
        return self.heads * (hd * hd + hd + 1)

    def flops(self, seq_len: int) -> int:
        L, D, H, hd = seq_len, self.dim, self.heads, self.inner_head_dim
        return 2 * L * D * (4 * H * hd + 2 * H) + self.non_matmul_flops(L) + 2 * L * H * hd * D

    def non_matmul_flops(self, seq_len: int) -> int:
        """The memory 6 L H hd^2 and the normaliser 6 L H hd (the recurrent form)."""
        L, H, hd = seq_len, self.heads, self.inner_head_dim
        return 6 * L * H * hd * hd + 6 * L * H * hd
