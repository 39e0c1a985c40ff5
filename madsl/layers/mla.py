"""Multi-head latent attention (`MLA`): the torch module of `madsl.primitives.mla`.

    q       = q_proj(x)  or  q_b_proj(rmsnorm(q_a_proj(x)))       (B, L, heads, nope + rope)
    c, k^R  = split(kv_a_proj_with_mqa(x)); c = rmsnorm(c)         (B, L, kv_lora_rank), (B, L, rope)
    k^C, v  = split(kv_b_proj(c))                                  per head
    out     = o_proj(SDPA([q^C, rot(q^R)], [k^C, rot(k^R)], v))    causal, scale 1/sqrt(nope + rope)

Where the value width differs from the query/key width, the narrower side is zero-padded to the
wider before SDPA (zeros add nothing to q.k, and the padded output channels are cut): torch's fused
CPU and CUDA kernels take one head width, and its fallback for two is an unfused softmax.

Step mode keeps the latent cache the accounting counts: "cache" (B, T, kv_lora_rank), the normed
latents, and "cache.rope" (B, T, rope), the rotated shared keys, plus "pos"; each step recomputes
every cached token's keys and values from the latent (kv_b_proj over the cache), which is what
the cache trades for its size.

Init: PyTorch's default Linear init, biases zero, norm weights one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.attention import scaled_dot_product_attention
from madsl.layers.rotary import rotate
from madsl.primitives.mla import MLA as MLAPrimitive


class MLA(nn.Module):
    stacks = True  # exact under vmap over stacked members: every op batches, SDPA folds

    def __init__(self, p: MLAPrimitive):
        super().__init__()
        dim, heads = p.dim, p.heads
        self.heads, self.latent, self.rope = heads, p.kv_lora_rank, p.qk_rope_head_dim
        self.nope, self.value_dim, self.qk_dim = p.qk_nope_head_dim, p.v_head_dim, p.qk_head_dim
        self.rotary, self.rotary_base = p.rotary, float(p.rotary_base)
        width = heads * p.qk_head_dim
        if p.q_lora_rank is None:
            self.q_proj = nn.Linear(dim, width, bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(dim, p.q_lora_rank, bias=p.bias)
            self.q_a_layernorm = nn.RMSNorm(p.q_lora_rank, eps=1e-6)
            self.q_b_proj = nn.Linear(p.q_lora_rank, width, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(dim, p.kv_lora_rank + p.qk_rope_head_dim, bias=p.bias)
        self.kv_a_layernorm = nn.RMSNorm(p.kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(p.kv_lora_rank, heads * (p.qk_nope_head_dim + p.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * p.v_head_dim, dim, bias=p.bias)
        for linear in (self.q_a_proj, self.kv_a_proj_with_mqa, self.o_proj):
            if linear is not None and linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def _queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """(B, L, heads, nope + rope), the rope part rotated."""
        q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.unflatten(-1, (self.heads, self.qk_dim))
        if not self.rotary:
            return q
        q_nope, q_rope = q.split((self.nope, self.rope), dim=-1)
        return torch.cat((q_nope, rotate(q_rope, positions, self.rotary_base)), dim=-1)

    def _latents(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The cached part of each token: normed latent (B, L, kv_lora_rank), rotated key (B, L, rope)."""
        latent, k_rope = self.kv_a_proj_with_mqa(x).split((self.latent, self.rope), dim=-1)
        if self.rotary:
            k_rope = rotate(k_rope.unsqueeze(-2), positions, self.rotary_base).squeeze(-2)
        return self.kv_a_layernorm(latent), k_rope

    def _attend(self, q: Tensor, latent: Tensor, k_rope: Tensor, causal: bool) -> Tensor:
        """Attention of q (B, Lq, heads, qk) over the keys and values of the cached latents -> o_proj."""
        k_nope, v = (
            self.kv_b_proj(latent)
            .unflatten(-1, (self.heads, self.nope + self.value_dim))
            .split((self.nope, self.value_dim), dim=-1)
        )
        k = torch.cat((k_nope, k_rope.unsqueeze(-2).expand(*k_nope.shape[:-1], self.rope)), dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, L, .)
        width = max(self.qk_dim, self.value_dim)
        q, k = (F.pad(t, (0, width - self.qk_dim)) for t in (q, k))
        v = F.pad(v, (0, width - self.value_dim))
        y = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=self.qk_dim**-0.5)
        y = y[..., : self.value_dim].transpose(1, 2)
        return self.o_proj(y.flatten(-2))

    # ---- parallel (training) form -----------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        return self.prefill(x)[0]

    def prefill(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The parallel forward and the latent cache `step` continues from."""
        batch, length, _ = x.shape
        positions = torch.arange(length, device=x.device)
        latent, k_rope = self._latents(x, positions)
        y = self._attend(self._queries(x, positions), latent, k_rope, causal=True)
        pos = torch.full((batch,), length, dtype=torch.long, device=x.device)
        return y, {"cache": latent, "cache.rope": k_rope, "pos": pos}

    # ---- recurrent (inference) form ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.o_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "cache": torch.zeros(batch, 0, self.latent, device=device, dtype=dtype),
            "cache.rope": torch.zeros(batch, 0, self.rope, device=device, dtype=dtype),
            "pos": torch.zeros(batch, dtype=torch.long, device=device),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        pos = state["pos"][:, None]  # (B, 1): each sequence's position
        x = x_t.unsqueeze(1)
        latent, k_rope = self._latents(x, pos)
        latent = torch.cat((state["cache"], latent.to(state["cache"].dtype)), dim=1)
        k_rope = torch.cat((state["cache.rope"], k_rope.to(state["cache.rope"].dtype)), dim=1)
        # the new token attends to every cached one: no mask
        y = self._attend(self._queries(x, pos), latent, k_rope, causal=False)
        return y[:, 0], {"cache": latent, "cache.rope": k_rope, "pos": state["pos"] + 1}
