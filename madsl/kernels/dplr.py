"""The diagonal-plus-rank-one recurrence of RWKV-7's time mixing (the "generalized delta rule"):
step and chunked forms.

Per head, with a log decay w_t <= 0 per key channel, a read direction a_t and a write direction
b_t (key_dim each), a key k_t and a value v_t:

    S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,      o_t = S_t^T r_t

(RWKV-7: a = -kk, b = kk * a_gate, so the memory forgets what it holds under kk by a_gate before
k v^T is written; flash-linear-attention's `chunk_rwkv7` / `dplr_recurrence`, scale 1). Layout
(head first): r, w, k, a, b (batch, heads, L, key_dim); v (batch, heads, L, value_dim); state
(batch, heads, key_dim, value_dim).

The chunked form: inside a chunk from state S_0, with B the inclusive cumulative log decay (per
channel) and B' = B - w the exclusive one, the reads rho_t = a_t^T S_{t-1} solve the unit
lower-triangular system

    rho_t - sum_{s<t} M_ab[t, s] rho_s = (a_t exp(B'_t))^T S_0 + sum_{s<t} M_ak[t, s] v_s,
    M_xy[t, s] = sum_d x_t[d] y_s[d] exp(B'_t[d] - B_s[d])

for all chunks at once; then o_t = (r_t exp(B_t))^T S_0 + sum_{s<=t} (N_rb[t, s] rho_s + N_rk[t, s] v_s)
with N the same products under exp(B_t - B_s), and the state carried to the next chunk. The
pairwise weights are written out per channel with -inf where they do not apply, before the exp:
every factor is at most 1 whatever the decay (as `madsl.kernels.channel_delta`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.linear_recurrence import full_precision
from madsl.kernels.member_fold import folds_into_batch


@full_precision
def dplr_step(
    r_t: Tensor, w_t: Tensor, k_t: Tensor, v_t: Tensor, a_t: Tensor, b_t: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token: r_t, w_t, k_t, a_t, b_t (batch, heads, key_dim); v_t (batch, heads, value_dim)."""
    read = (a_t.unsqueeze(-2) @ state).squeeze(-2)  # a^T S_{t-1}: what the memory holds along a
    state = w_t.exp().unsqueeze(-1) * state + b_t.unsqueeze(-1) * read.unsqueeze(-2)
    state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    return (r_t.unsqueeze(-2) @ state).squeeze(-2), state


def _in_chunks(x: Tensor, chunk: int) -> Tensor:
    """(batch, heads, L, d) -> (batch, heads, n_chunks, chunk, d), zero-padded: padding writes and
    reads nothing (k = v = a = b = 0) and decays nothing (w = 0)."""
    length = x.shape[2]
    padded = -(-length // chunk) * chunk
    return F.pad(x, (0, 0, 0, padded - length)).unflatten(2, (padded // chunk, chunk))


def _pairwise(to: Tensor, since: Tensor, mask: Tensor) -> Tensor:
    """exp(to_t - since_s) per channel (.., C, C, K) where mask[t, s], else 0."""
    return (to.unsqueeze(-2) - since.unsqueeze(-3)).masked_fill(~mask.unsqueeze(-1), float("-inf")).exp()


def _products(x: Tensor, weights: Tensor, y: Tensor) -> Tensor:
    """[t, s] = sum_d x_t[d] weights[t, s, d] y_s[d]."""
    return ((weights * y.unsqueeze(-3)) @ x.unsqueeze(-1)).squeeze(-1)


@full_precision
def dplr_chunked(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """Chunked form of the token-by-token recurrence `dplr_step` (see the module docstring)."""
    batch, heads, length, key_dim = r.shape
    value_dim = v.shape[-1]
    chunk = max(1, min(chunk_size, length))
    r, w, k, v, a, b = (_in_chunks(x, chunk) for x in (r, w, k, v, a, b))
    inclusive = w.cumsum(-2)
    exclusive = inclusive - w
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=r.device).tril()
    before = _pairwise(exclusive, inclusive, lower.tril(-1))  # exp(B'_t - B_s), s < t
    upto = _pairwise(inclusive, inclusive, lower)  # exp(B_t - B_s), s <= t
    eye = torch.eye(chunk, dtype=r.dtype, device=r.device)
    rhs = torch.cat((_products(a, before, k) @ v, a * exclusive.exp()), dim=-1)
    solved = torch.linalg.solve_triangular(eye - _products(a, before, b), rhs, upper=False, unitriangular=True)
    read_v, read_s = solved.split((value_dim, key_dim), dim=-1)  # reads = read_v + read_s S_0
    on_reads, on_values = _products(r, upto, b), _products(r, upto, k) @ v

    last = inclusive[..., -1:, :]
    state = initial_state if initial_state is not None else r.new_zeros(batch, heads, key_dim, value_dim)
    outputs = []
    for read_v_n, read_s_n, r_n, on_reads_n, on_values_n, decay_n, b_n, k_n, v_n in zip(
        read_v.unbind(2),
        read_s.unbind(2),
        (r * inclusive.exp()).unbind(2),
        on_reads.unbind(2),
        on_values.unbind(2),
        last.exp().transpose(-1, -2).unbind(2),
        (b * (last - inclusive).exp()).transpose(-1, -2).unbind(2),
        (k * (last - inclusive).exp()).transpose(-1, -2).unbind(2),
        v.unbind(2),
    ):
        reads = read_v_n + read_s_n @ state
        outputs.append(r_n @ state + on_reads_n @ reads + on_values_n)
        state = decay_n * state + b_n @ reads + k_n @ v_n
    out = torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :length]
    return out, state


@folds_into_batch  # under vmap one call for all members
def dplr_parallel(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """o of the recurrence from a zero state, by `dplr_chunked`."""
    return dplr_chunked(r, w, k, v, a, b)[0]
