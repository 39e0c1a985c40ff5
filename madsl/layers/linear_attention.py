"""Linear attention (`Lin`, `mLin`): the torch module of `madsl.primitives.linear_attention`.

    q, k, v = phi_q(proj_q(x)), phi_k(proj_k(x)), proj_v(x)          per head
    o_t = sum_{s<=t} (q_t . k_s) v_s / (sum_{s<=t} q_t . k_s + eps)   (normalize)
    out = out_proj(o)

The normaliser rides along as one more value column (v = [v, 1]), so one state matrix per head,
(key_dim, value_dim + 1), carries both: "fixed" (batch, heads, key_dim, value_dim + 1). Training
runs `madsl.kernels.linear_recurrence.decay_parallel` (no decay; fla's kernel on CUDA, else the
chunked form), `step` the
recurrence.

Init: PyTorch's default Linear init (as the MAD reference).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import decay_parallel, decay_step
from madsl.primitives.linear_attention import LinearAttention as LinearAttentionPrimitive

EPS = 1e-12  # the MAD reference's


class HadamardFeatureMap(nn.Module):
    """phi(x) = W1 x * W2 x (with biases), over the last (head) dimension."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.layer1 = nn.Linear(head_dim, head_dim)
        self.layer2 = nn.Linear(head_dim, head_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer1(x) * self.layer2(x)


def _feature_map(kind: str, head_dim: int) -> nn.Module:
    if kind == "elementwise_product":
        return HadamardFeatureMap(head_dim)
    return {"elu": _EluPlusOne, "relu": nn.ReLU, "identity": nn.Identity}[kind]()


class _EluPlusOne(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1


class LinearAttention(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: LinearAttentionPrimitive):
        super().__init__()
        self.heads, self.key_dim, self.value_dim = p.heads, p.key_dim, p.value_dim
        self.normalize = p.normalize
        self.chunk_size = 64
        self.proj_q = nn.Linear(p.dim, p.expand_k * p.dim, bias=False)
        self.proj_k = nn.Linear(p.dim, p.expand_k * p.dim, bias=False)
        self.proj_v = nn.Linear(p.dim, p.expand_v * p.dim, bias=False)
        self.feature_map_q = _feature_map(p.feature_map, p.key_dim)
        self.feature_map_k = _feature_map(p.feature_map, p.key_dim)
        self.out_proj = nn.Linear(p.expand_v * p.dim, p.dim, bias=False)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lead = x.shape[:-1]
        q = self.feature_map_q(self.proj_q(x).view(*lead, self.heads, self.key_dim))
        k = self.feature_map_k(self.proj_k(x).view(*lead, self.heads, self.key_dim))
        v = self.proj_v(x).view(*lead, self.heads, self.value_dim)
        if self.normalize:
            v = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)
        return q, k, v

    def _readout(self, o: Tensor) -> Tensor:
        if self.normalize:
            o = o[..., :-1] / (o[..., -1:] + EPS)
        return self.out_proj(o.flatten(-2))

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = (t.transpose(1, 2) for t in self._project(x))
        o = decay_parallel(q, k, v, None, chunk_size=self.chunk_size)
        return self._readout(o.transpose(1, 2).to(x.dtype))

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        columns = self.value_dim + (1 if self.normalize else 0)
        return {
            "fixed": torch.zeros(
                batch, self.heads, self.key_dim, columns, device=device or weight.device, dtype=dtype or weight.dtype
            )
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        q, k, v = self._project(x_t)
        o, fixed = decay_step(q, k, v, None, state["fixed"])
        return self._readout(o.to(x_t.dtype)), {"fixed": fixed}
