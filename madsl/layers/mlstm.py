"""mLSTM (`mL`): the torch module of `madsl.primitives.mlstm`.

Parallel form (the xLSTM paper's, App. B.3), per head, with F_t = sum_{j<=t} log sigmoid(f~_j):

    log D[t, s] = F_t - F_s + i~_s  (s <= t),   m_t = max_s log D[t, s]
    C~ = (q k^T / sqrt(head_dim)) * exp(log D - m),   h_t = (C~ v)_t / max(|sum_s C~[t, s]|, exp(-m_t))

quadratic in L, like attention (the paper's own training form). Step mode carries the stabilised
memory with the normaliser as one more value column, "fixed" (batch, heads, head_dim,
head_dim + 1) = [C | n], and the stabiliser "fixed.stabilizer" (batch, heads), starting at -inf
(nothing seen yet), so that m_t is the same maximum in both forms and they agree exactly.

Queries and keys may be narrower than values (qk_head_dim: the memory is qk_head_dim x head_dim).
With zero_stabilizer (xLSTM's kernels, which start from a zero state with m_0 = 0) the parallel form's
maximum also takes the empty prior's log weight F_t, and step mode starts its stabiliser at 0; eps is
added to the normaliser in both forms; gate_soft_cap caps i~ and f~ as cap * tanh(x / cap) first.

Init (as xLSTM's mLSTMCell): the forget gate's bias linspace(3, 6) over heads, the input gate's
bias N(0, 0.1), both gates' weights zero; PyTorch's default for the projections; norm weight one
(its bias, where there is one, zero).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from madsl.kernels.linear_recurrence import full_precision
from madsl.primitives.mlstm import MLSTM as MLSTMPrimitive


@full_precision
def mlstm_parallel(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_input: Tensor,
    log_forget: Tensor,
    zero_stabilizer: bool = False,
    eps: float = 0.0,
) -> tuple[Tensor, None]:
    """q, k (batch, heads, L, qk_head_dim) (k scaled), v (batch, heads, L, head_dim); log_input,
    log_forget (batch, heads, L). zero_stabilizer: the stabiliser as a recurrence from m_0 = 0."""
    length = q.shape[2]
    cumulative = log_forget.cumsum(-1)
    log_d = cumulative.unsqueeze(-1) - cumulative.unsqueeze(-2) + log_input.unsqueeze(-2)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    log_d = log_d.masked_fill(~causal, float("-inf"))
    m = log_d.amax(-1, keepdim=True)
    if zero_stabilizer:  # the zero initial state's term: log weight F_t, nothing in C or n
        m = torch.maximum(m, cumulative.unsqueeze(-1))
    weights = (q @ k.transpose(-1, -2)) * (log_d - m).exp()
    denominator = torch.maximum(weights.sum(-1, keepdim=True).abs(), (-m).exp())
    if eps:
        denominator = denominator + eps
    return (weights @ v) / denominator, None


@full_precision
def mlstm_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_input: Tensor,
    log_forget: Tensor,
    memory: Tensor,
    stabilizer: Tensor,
    eps: float = 0.0,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One token: q, k (batch, heads, qk_head_dim), v (batch, heads, head_dim); gates (batch, heads);
    memory [C | n] (batch, heads, qk_head_dim, head_dim + 1); stabilizer (batch, heads)."""
    m = torch.maximum(log_forget + stabilizer, log_input)
    forget = (log_forget + stabilizer - m).exp()[..., None, None]
    write = (log_input - m).exp()[..., None, None]
    values = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)
    memory = forget * memory + write * k.unsqueeze(-1) * values.unsqueeze(-2)
    read = (q.unsqueeze(-2) @ memory).squeeze(-2)
    denominator = torch.maximum(read[..., -1:].abs(), (-m).exp().unsqueeze(-1))
    if eps:
        denominator = denominator + eps
    return read[..., :-1] / denominator, (memory, m)


class MLSTM(nn.Module):
    stacks = True  # exact under vmap over stacked members (madsl.runner.batched.stacked): every op batches or folds

    def __init__(self, p: MLSTMPrimitive):
        super().__init__()
        self.heads, self.head_dim, self.key_dim = p.heads, p.inner_head_dim, p.key_head_dim
        self.gate_soft_cap, self.norm_eps, self.eps = p.gate_soft_cap, p.norm_eps, p.eps
        self.zero_stabilizer = p.zero_stabilizer
        self.q_proj = nn.Linear(p.dim, p.key_inner, bias=p.bias)
        self.k_proj = nn.Linear(p.dim, p.key_inner, bias=p.bias)
        self.v_proj = nn.Linear(p.dim, p.inner, bias=p.bias)
        self.igate = nn.Linear(p.dim, p.heads)
        self.fgate = nn.Linear(p.dim, p.heads)
        self.o_proj = nn.Linear(p.dim, p.inner, bias=p.bias)
        self.norm_weight = nn.Parameter(torch.ones(p.inner))
        self.out_proj = nn.Linear(p.inner, p.dim, bias=p.bias)
        self.norm_bias = nn.Parameter(torch.zeros(p.inner)) if p.bias else None
        with torch.no_grad():
            for gate in (self.igate, self.fgate):
                nn.init.zeros_(gate.weight)
            self.fgate.bias.copy_(torch.linspace(3.0, 6.0, p.heads))
            nn.init.normal_(self.igate.bias, std=0.1)

    def _project(self, x: Tensor) -> tuple[Tensor, ...]:
        lead = x.shape[:-1]
        keys, values = (*lead, self.heads, self.key_dim), (*lead, self.heads, self.head_dim)
        q, k, v = (
            self.q_proj(x).view(keys),
            self.k_proj(x).view(keys) * self.key_dim**-0.5,
            self.v_proj(x).view(values),
        )
        log_input, forget = self.igate(x), self.fgate(x)
        if self.gate_soft_cap is not None:
            cap = self.gate_soft_cap
            log_input, forget = cap * torch.tanh(log_input / cap), cap * torch.tanh(forget / cap)
        return q, k, v, log_input, F.logsigmoid(forget)

    def _readout(self, h: Tensor, x: Tensor) -> Tensor:
        """h (..., heads, head_dim): per-head LayerNorm (float32 statistics), output gate, out_proj."""
        with torch.autocast(device_type=h.device.type, enabled=False):
            h = h.to(torch.promote_types(h.dtype, torch.float32))
            h = F.layer_norm(h, (self.head_dim,), eps=self.norm_eps).flatten(-2) * self.norm_weight.to(h.dtype)
            if self.norm_bias is not None:
                h = h + self.norm_bias.to(h.dtype)
        h = h.to(self.out_proj.weight.dtype) * torch.sigmoid(self.o_proj(x))
        return self.out_proj(h)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v, log_input, log_forget = self._project(x)
        h, _ = mlstm_parallel(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            log_input.transpose(1, 2),
            log_forget.transpose(1, 2),
            self.zero_stabilizer,
            self.eps,
        )
        return self._readout(h.transpose(1, 2), x)

    def init_state(self, batch: int, device=None, dtype=None) -> dict[str, Tensor]:
        weight = self.out_proj.weight
        device, dtype = device or weight.device, dtype or weight.dtype
        return {
            "fixed": torch.zeros(batch, self.heads, self.key_dim, self.head_dim + 1, device=device, dtype=dtype),
            "fixed.stabilizer": torch.full(
                (batch, self.heads), 0.0 if self.zero_stabilizer else float("-inf"), device=device, dtype=dtype
            ),
        }

    def step(self, x_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        q, k, v, log_input, log_forget = self._project(x_t)
        memory, stabilizer = state["fixed"], state["fixed.stabilizer"]
        h, (memory, m) = mlstm_step(q, k, v, log_input, log_forget, memory, stabilizer, self.eps)
        return self._readout(h, x_t), {"fixed": memory, "fixed.stabilizer": m}
