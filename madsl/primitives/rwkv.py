"""RWKV time mixers (`R5`: RWKV-5 "Eagle", `R6`: RWKV-6 "Finch"; Peng et al. 2024) and their
channel mixer (`R5c`, `R6c`).

Time mixer, per head of head_dim channels, with a per-channel decay w_t in (0, 1) and bonus u:

    o_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),   S_t = diag(w_t) S_{t-1} + k_t v_t^T

r, k, v and the output gate g read a token-shifted input: each channel interpolates between the
current token and the previous one (RWKV-5: a learned mix per channel; RWKV-6: plus a low-rank
data-dependent mix, "ddlerp", of rank mix_rank). RWKV-5's decay is a constant per channel,
w = exp(-exp(time_decay)); RWKV-6's adds a low-rank (decay_rank) data-dependent term. The output
is group-normalised per head (of o / head_dim_divisor), multiplied by silu(g), projected back.

Layout and defaults of the MAD reference (athms/mad-lab mad/model/layers/rwkv/rwkv5.py and
rwkv6.py, configs/layers/rwkv{5,6}-time-mixer.yml): head_dim 16, dim_att = dim, head_dim_divisor 8,
RWKV-6's extra dims 32 (mix) and 64 (decay); receptance, key, value, gate dim -> dim_att and
output dim_att -> dim without bias; ln_x GroupNorm(heads, dim_att) with weight and bias.

Parameters (A = dim_att): 4DA + AD + 2A (decay, bonus) + 2A (ln_x), plus RWKV-5: 4D (mixes);
RWKV-6: 6D (mixes) + 2 * 5 * mix_rank * D (ddlerp) + decay_rank (D + A).
State: heads * head_dim^2 = A * head_dim (128 * 16 = 2048 at width 128); the token shift keeps
the previous input, D numbers, reported as conv_state (it is a 2-tap convolution's buffer).
FLOPs (recurrent form): projections 2LD * 4A + out 2LAD, WKV 5LA head_dim (decay, update,
readout, bonus), token shift 8LD; RWKV-6 adds 20 L D mix_rank + 2L decay_rank (D + A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import Primitive, divides, positive


@dataclass(frozen=True)
class RWKV(Primitive):
    version: Literal[5, 6]
    head_dim: int
    dim_att: int | None  # None: dim
    head_dim_divisor: int
    mix_rank: int  # RWKV-6's data-dependent token shift (TIME_MIX_EXTRA_DIM)
    decay_rank: int  # RWKV-6's data-dependent decay (TIME_DECAY_EXTRA_DIM)

    name = "rwkv"
    role = "sequence"
    module = "madsl.layers.rwkv:RWKV"

    def validate(self) -> None:
        positive(self, "head_dim", "dim_att", "head_dim_divisor", "mix_rank", "decay_rank")
        divides(self, "head_dim", self.head_dim, self.att, "dim_att")

    @property
    def att(self) -> int:
        return self.dim_att if self.dim_att is not None else self.dim

    @property
    def heads(self) -> int:
        return self.att // self.head_dim

    def params(self) -> int:
        D, A = self.dim, self.att
        total = 5 * D * A + 4 * A
        if self.version == 5:
            return total + 4 * D
        return total + 6 * D + 2 * 5 * self.mix_rank * D + self.decay_rank * (D + A)

    def fixed_state(self) -> int:
        return self.att * self.head_dim

    def conv_state(self) -> int:
        return self.dim

    def flops(self, seq_len: int) -> int:
        L, D, A = seq_len, self.dim, self.att
        total = 10 * L * D * A + self.non_matmul_flops(L)
        if self.version == 6:
            total += 20 * L * D * self.mix_rank + 2 * L * self.decay_rank * (D + A)
        return total

    def non_matmul_flops(self, seq_len: int) -> int:
        """WKV, 5 L A head_dim, and the token shift, 8 L D."""
        return 5 * seq_len * self.att * self.head_dim + 8 * seq_len * self.dim


@dataclass(frozen=True)
class RWKVChannel(Primitive):
    """RWKV's channel mixer: out = sigmoid(receptance(x_r)) * value(relu(key(x_k))^2), x_r and x_k
    token-shifted as in the time mixer. RWKV-5's and RWKV-6's are the same function (RWKV-5 writes
    the mix as x * mix + x_prev * (1 - mix), RWKV-6 as x + (x_prev - x) * maa), so `R5c` and `R6c`
    are one primitive. Defaults: inner 512 (configs/layers/rwkv{5,6}-channel-mixer.yml).
    receptance false: RWKV-7's channel mixer (fla's RWKV7FeedForward: out = value(relu(key(x_k))^2),
    one mix x_k, no receptance gate).
    Parameters: 2D (mixes) + D inner + D^2 + inner D; without the receptance D + 2 D inner. State: the
    previous input, D numbers (conv_state): a channel mixer that looks one token back.
    FLOPs: 4 L D inner + 2 L D^2 + 4LD; without the receptance 4 L D inner + 2LD."""

    inner: int
    receptance: bool  # the sigmoid receptance gate and its mix (RWKV-5/6); false: RWKV-7's channel mixer

    name = "rwkv_channel"
    role = "channel"
    module = "madsl.layers.rwkv:RWKVChannel"
    identity_omits = ("receptance",)  # added later: stored runs keep their ids

    def validate(self) -> None:
        positive(self, "inner")

    def params(self) -> int:
        D = self.dim
        return (2 * D + D * D if self.receptance else D) + 2 * D * self.inner

    def conv_state(self) -> int:
        return self.dim

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        return 4 * L * D * self.inner + (2 * L * D * D if self.receptance else 0) + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The token shift and the gate, 4 L D (the token shift of one mix alone, 2 L D)."""
        return (4 if self.receptance else 2) * seq_len * self.dim
