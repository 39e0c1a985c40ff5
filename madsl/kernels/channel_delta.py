"""The delta rule with a decay per key channel (Kimi Delta Attention): step and chunked forms.

Per head, with a log decay g_t <= 0 per key channel (a vector of key_dim, where Gated DeltaNet has
one scalar) and a write strength beta_t:

    S'_t = diag(exp(g_t)) S_{t-1}
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T,          o_t = S_t^T q_t

(q used as given: the caller normalises and scales it). Layout (head first): q, k, log_decay
(batch, heads, L, key_dim); v (batch, heads, L, value_dim); beta (batch, heads, L); state
(batch, heads, key_dim, value_dim).

The chunked form is the WY / UT transform of `madsl.kernels.linear_recurrence.delta_chunked` with
the scalar decay weights exp(b_t - b_s) replaced by per-channel ones inside the products: with b
the cumulative log decay inside a chunk (per channel) and S_0 the state carried in,

    u_t = beta_t (v_t - (exp(b_t) * k_t)^T S_0 - sum_{s<t} A'[t, s] u_s),
    A'[t, s] = sum_d k_t[d] k_s[d] exp(b_t[d] - b_s[d]),

a unit lower-triangular system solved for all chunks at once; the outputs are
o_t = (exp(b_t) * q_t)^T S_0 + sum_{s<=t} P[t, s] u_s with P the same weighted product of q and k.
The pairwise weights exp(b_t - b_s) (s <= t) are written out per channel, (chunk x chunk x
key_dim) per chunk, with -inf above the diagonal before the exp: every factor is at most 1, for
any decay, so no chunk needs shrinking; the price is that tensor's memory, hence short chunks (16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.linear_recurrence import full_precision
from madsl.kernels.member_fold import folds_into_batch


@full_precision
def channel_delta_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, log_decay_t: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token: q_t, k_t, log_decay_t (batch, heads, key_dim); v_t (batch, heads, value_dim); beta_t
    (batch, heads). Returns (o_t, new state)."""
    state = log_decay_t.exp().unsqueeze(-1) * state
    predicted = (k_t.unsqueeze(-2) @ state).squeeze(-2)  # S'^T k: what the memory holds under k
    written = beta_t.unsqueeze(-1) * (v_t - predicted)
    state = state + k_t.unsqueeze(-1) * written.unsqueeze(-2)
    return (q_t.unsqueeze(-2) @ state).squeeze(-2), state


def _in_chunks(x: Tensor, chunk: int) -> Tensor:
    """(batch, heads, L, ...) -> (batch, heads, n_chunks, chunk, ...), zero-padded at the end: padding
    writes nothing (k = v = beta = 0) and decays nothing (g = 0)."""
    length = x.shape[2]
    padded = -(-length // chunk) * chunk
    if padded != length:
        x = F.pad(x, [0, 0] * (x.dim() - 3) + [0, padded - length])
    return x.unflatten(2, (padded // chunk, chunk))


@full_precision
def channel_delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """Chunked (WY) form of the token-by-token recurrence `channel_delta_step` (see the module docstring)."""
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    chunk = max(1, min(chunk_size, length))
    q, k, v, beta, log_decay = (_in_chunks(x, chunk) for x in (q, k, v, beta, log_decay))
    b = log_decay.cumsum(-2)  # (B, H, N, C, K)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    pairwise = (b.unsqueeze(-2) - b.unsqueeze(-3)).masked_fill(~causal.unsqueeze(-1), float("-inf")).exp()
    weighted_k = pairwise * k.unsqueeze(-3)  # [t, s, d] = exp(b_t[d] - b_s[d]) k_s[d], s <= t
    strict = beta.unsqueeze(-1) * (weighted_k @ k.unsqueeze(-1)).squeeze(-1).tril(-1)  # A[t, s], s < t
    scores = (weighted_k @ q.unsqueeze(-1)).squeeze(-1)  # P[t, s], s <= t
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = torch.cat((beta.unsqueeze(-1) * v, beta.unsqueeze(-1) * k * b.exp()), dim=-1)
    solved = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split((value_dim, key_dim), dim=-1)  # U = u_v - w S_0

    b_last = b[..., -1:, :]  # (B, H, N, 1, K)
    state = initial_state if initial_state is not None else q.new_zeros(batch, heads, key_dim, value_dim)
    outputs = []
    # unbind, not indexing: one backward node per tensor
    for u_v_n, w_n, q_n, scores_n, decay_n, k_n in zip(
        u_v.unbind(2),
        w.unbind(2),
        (q * b.exp()).unbind(2),
        scores.unbind(2),
        b_last.exp().transpose(-1, -2).unbind(2),
        (k * (b_last - b).exp()).transpose(-1, -2).unbind(2),
    ):
        u = u_v_n - w_n @ state
        outputs.append(q_n @ state + scores_n @ u)
        state = decay_n * state + k_n @ u
    out = torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :length]
    return out, state


@folds_into_batch  # under vmap one call for all members (its triangular solve batches either way)
def channel_delta_parallel(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor) -> Tensor:
    """o of the recurrence from a zero state, by `channel_delta_chunked`."""
    return channel_delta_chunked(q, k, v, beta, log_decay)[0]
