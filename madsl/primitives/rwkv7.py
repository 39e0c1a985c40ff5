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
GroupNorm(heads, dim) with weight and bias.

value_residual (fla's RWKV7Attention with layer_idx > 0): the layer mixes its values toward the
values v_first of the model's first R7 layer, v = v + (v_first - v) * sigmoid(v_lora(x_v)), v_lora a
low-rank map of rank value_rank with a bias and no inner activation. The compiler links the two
(madsl/compiler.py `link_value_residuals`: the first R7 use produces v_first in every forward, step
and prefill, later uses read it in the same call); a value_residual layer with no R7 before it is a
located spec error. A layer built alone (no link) mixes toward zeros, fla's v_first before any layer.
l2norm_eps: kk = k / sqrt(|k|^2 + eps) per head; 0 is F.normalize (fla's RWKV7Attention with
fuse_norm false), 1e-6 fla's fused l2_norm (fuse_norm true, its default).

Defaults (stdlib): 2 heads (head_dim 64 at width 128, RWKV-7's head size), LoRA ranks by fla's
rule at width 128: decay 32, a 32, gate 64, value 32; no value residual (a first layer), l2norm_eps 0.

Parameters: 4D^2 + 13D + 2D (decay_rank + a_rank + gate_rank) (the mixes 6D, k_k, k_a, r_k 3D,
the two LoRA biases 2D, the norm 2D), and with value_residual the v_lora's 2D value_rank + D.
State: dim * head_dim (128 * 64 = 8192 at the default);
the token shift keeps the previous input, dim numbers, reported as conv_state.
FLOPs (recurrent form): projections 8LD^2, LoRAs 4LD (decay_rank + a_rank + gate_rank), the
recurrence 9 L dim head_dim (read, decay, the rank-one and the k v^T updates, readout) and the
token-shift mixes 12 L D; norms, gates and the bonus (elementwise) are not counted; value_residual
adds v_lora's 4 L D value_rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import ConfigError, Primitive, divides, positive


@dataclass(frozen=True)
class RWKV7(Primitive):
    heads: int  # head_dim = dim // heads
    decay_rank: int  # w_lora's rank (fla's decay_low_rank_dim)
    a_rank: int  # a_lora's rank (a_low_rank_dim)
    gate_rank: int  # g_lora's rank (gate_low_rank_dim)
    value_residual: bool  # mix the values toward the first R7 layer's (fla's layers after the first)
    value_rank: int  # v_lora's rank (v_low_rank_dim); read only with value_residual
    l2norm_eps: float  # kk's l2 norm: k / sqrt(|k|^2 + eps); 0: F.normalize

    name = "rwkv7"
    role = "sequence"
    module = "madsl.layers.rwkv7:RWKV7"
    identity_omits = ("value_residual", "value_rank", "l2norm_eps")  # added later: stored runs keep their ids

    def validate(self) -> None:
        positive(self, "heads", "decay_rank", "a_rank", "gate_rank", "value_rank")
        if self.l2norm_eps < 0:
            raise ConfigError("l2norm_eps", f"must not be negative, got {self.l2norm_eps}")
        divides(self, "heads", self.heads, self.dim, "dim")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def params(self) -> int:
        D = self.dim
        return 4 * D * D + 13 * D + 2 * D * (self.decay_rank + self.a_rank + self.gate_rank) + self._value_lora()

    def _value_lora(self) -> int:
        """v_lora's parameters: D x value_rank down, value_rank x D up, the bias D; none without it."""
        return (2 * self.value_rank + 1) * self.dim if self.value_residual else 0

    def fixed_state(self) -> int:
        return self.dim * self.head_dim

    def conv_state(self) -> int:
        return self.dim

    def flops(self, seq_len: int) -> int:
        L, D = seq_len, self.dim
        ranks = self.decay_rank + self.a_rank + self.gate_rank + (self.value_rank if self.value_residual else 0)
        return 8 * L * D * D + 4 * L * D * ranks + self.non_matmul_flops(L)

    def non_matmul_flops(self, seq_len: int) -> int:
        """The recurrence 9 L D head_dim and the token-shift mixes 12 L D."""
        return 9 * seq_len * self.dim * self.head_dim + 12 * seq_len * self.dim
