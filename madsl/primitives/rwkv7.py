"""RWKV-7 "Goose" time mixing (`R7`; Peng et al. 2025): the generalized delta rule.

Per head of head_dim channels, a memory S (head_dim x head_dim) with a decay per key channel
w_t in (exp(-e^-0.5), 1), and an in-context learning rate a_t per channel:

    S_t = diag(w_t) S_{t-1} - (kk_t * a_t) (kk_t^T S_{t-1}) + k_t v_t^T,    o_t = S_t^T r_t

r, w, k, v, a and the output gate g read a token-shifted input, each through its own learned mix
of the current and the previous token (x + (x_{t-1} - x) * mu). kk = l2norm(k * k_k) per head
removes, at rate a, what the memory holds along k, before k itself (scaled by 1 + (a - 1) k_a)
is written. w = exp(-e^-0.5 sigmoid(w_lora(x_w))), a = sigmoid(a_lora(x_a)), g = g_lora(x_g),
each a low-rank map (w: tanh inside, bias; a: bias; g: sigmoid inside, no bias). The output is
group-normalised per head, plus the bonus (sum_d r k r_k) v per head, times g, projected back.

Layout of flash-linear-attention's `RWKV7Attention` of a first layer (hidden_size = key_dim =
value_dim = dim): x_r, x_w, x_k, x_v, x_a, x_g (dim each), k_k, k_a (dim), r_k (heads, head_dim);
r_proj, k_proj, v_proj, o_proj dim x dim without bias; w_lora, a_lora, g_lora; g_norm a
GroupNorm(heads, dim) with weight and bias. Later layers of an RWKV-7 model also mix in the first
layer's values (v_lora, the "value residual"), a connection between layers that a madsl layer
does not have: this primitive is the time mixer without it.

Defaults (stdlib): 2 heads (head_dim 64 at width 128, RWKV-7's head size), LoRA ranks by fla's
rule at width 128: decay 32, a 32, gate 64.

Parameters: 4D^2 + 13D + 2D (decay_rank + a_rank + gate_rank) (the mixes 6D, k_k, k_a, r_k 3D,
the two LoRA biases 2D, the norm 2D). State: dim * head_dim (128 * 64 = 8192 at the default);
the token shift keeps the previous input, dim numbers, reported as conv_state.
FLOPs (recurrent form): projections 8LD^2, LoRAs 4LD (decay_rank + a_rank + gate_rank), the
recurrence 9 L dim head_dim (read, decay, the rank-one and the k v^T updates, readout) and the
token-shift mixes 12 L D; norms, gates and the bonus (elementwise) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Primitive, divides, positive


@dataclass(frozen=True)
class RWKV7(Primitive):
    heads: int  # head_dim = dim // heads
    decay_rank: int  # w_lora's rank (fla's decay_low_rank_dim)
    a_rank: int  # a_lora's rank (a_low_rank_dim)
    gate_rank: int  # g_lora's rank (gate_low_rank_dim)

    name = "rwkv7"
    role = "sequence"
    module = "madsl.layers.rwkv7:RWKV7"

    def validate(self) -> None:
        positive(self, "heads", "decay_rank", "a_rank", "gate_rank")
        divides(self, "heads", self.heads, self.dim, "dim")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def params(self) -> int:
        D = self.dim
        return 4 * D * D + 13 * D + 2 * D * (self.decay_rank + self.a_rank + self.gate_rank)

    def fixed_state(self) -> int:
        return self.dim * self.head_dim

    def conv_state(self) -> int:
        return self.dim

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        return 8 * L * D * D + 4 * L * D * (self.decay_rank + self.a_rank + self.gate_rank) + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The recurrence 9 L D head_dim and the token-shift mixes 12 L D."""
        return 9 * seq_len * self.dim * self.head_dim + 12 * seq_len * self.dim
