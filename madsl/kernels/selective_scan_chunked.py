"""Mamba's selective scan as a chunked parallel scan in pure PyTorch: the GPU path
when mamba-ssm is not installed (it also runs, and is tested, on the CPU).

Same arguments, semantics and result as `selective_scan_cpu` / mamba-ssm's
`selective_scan_fn` (real A; B, C of shape (batch, d_state, L) or grouped (batch,
groups, d_state, L)). Differentiated by autograd.

The recurrence h_t = a_t h_{t-1} + b_t, with a_t = exp(delta_t A) and
b_t = delta_t u_t B_t, has a diagonal decay, and its cumulative log-decay factorises:
inside a chunk, S_t[d, n] = A[d, n] * (delta_1 + ... + delta_t)[d]. So

    h_t = exp(S_t - r) * (exp(r - S_0) h_0 + sum_{s<=t} exp(r - S_s) b_s)

is one cumulative sum over the chunk's steps, done for every chunk at once (no
Python loop over time). r is the middle of the chunk's range of S per (d, n), so no
factor exceeds exp(half the chunk's decay range after its first step). Where a chunk decays by more than
the dtype holds that way, the chunk is halved until none does (down to 1, the
recurrence itself): exact for any delta. Only the carry from chunk to chunk runs as a
loop (L / chunk steps), and it only ever sees factors <= 1.

Every state h_t is materialised, (batch, L, d_inner, d_state), in float32 (float64
for float64 inputs): cheap on a GPU at MAD's sizes (batch 128 x L 128 x 256 x 4 is 16M
elements), which is why it is not the CPU path (madsl's fused CPU scan never
allocates it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.precision import compute_dtype

# Longest chunk; halved where the decay inside a chunk would overflow the factorisation.
DEFAULT_CHUNK = 128


def _safe_exponent(dtype: torch.dtype) -> float:
    """|x| up to which exp(x) stays a normal number of `dtype` with room for the size of
    the inputs (float32: 69.8, float64: 567)."""
    return -0.8 * math.log(torch.finfo(dtype).tiny)


def _largest_safe_chunk(delta: Tensor, A: Tensor, chunk: int) -> int:
    """Halve `chunk` until no chunk's decay range, |A| times the chunk's sum of delta
    after its first step, exceeds twice the safe exponent. delta (batch, L, d_inner)."""
    limit = 2 * _safe_exponent(delta.dtype)
    length = delta.shape[1]
    max_rate = A.abs().amax(dim=1)  # (d_inner,): the fastest decay of each channel
    with torch.no_grad():
        while chunk > 1:
            padded = -(-length // chunk) * chunk
            d = F.pad(delta, (0, 0, 0, padded - length)).unflatten(1, (padded // chunk, chunk))
            if float((d[:, :, 1:].sum(2) * max_rate).max()) <= limit:
                break
            chunk //= 2
    return chunk


def _chunked_states(
    u_t: Tensor, delta_t: Tensor, A: Tensor, B_t: Tensor, chunk: int, last_state: bool
) -> tuple[Tensor, Tensor]:
    """Every state h_t (batch, L, d_inner, d_state) of the recurrence, and the state the carry across
    chunks ends with (h_L where `last_state`; otherwise the state before the last chunk). u_t, delta_t
    (batch, L, d_inner) time before channels, delta_t after bias and softplus; B_t (batch, L, groups,
    d_state)."""
    groups = B_t.shape[2]
    batch, length, d_inner = u_t.shape
    d_state = A.shape[1]
    padded = -(-length // chunk) * chunk
    n_chunks = padded // chunk
    # Padding: delta = 0 neither decays nor adds (b = delta u B = 0), so the states of
    # the real steps and the last state are those of the unpadded sequence.
    delta_c, u_c, B_c = (
        F.pad(x, (0, 0) * (x.dim() - 2) + (0, padded - length)).unflatten(1, (n_chunks, chunk))
        for x in (delta_t, u_t, B_t)
    )

    # (batch, n_chunks, chunk, d_inner, d_state)
    log_decay = delta_c.cumsum(2).unsqueeze(-1) * A  # S_t, non-increasing in t
    ref = 0.5 * (log_decay[:, :, :1] + log_decay[:, :, -1:])  # middle of [S_last, S_1]
    # b_t, channel d with its group's B: (..., groups, d_inner / groups, d_state) -> (..., d_inner, d_state)
    inputs = ((delta_c * u_c).unflatten(-1, (groups, -1)).unsqueeze(-1) * B_c.unsqueeze(-2)).flatten(-3, -2)
    # Two exps rather than one division: its gradient would overflow.
    local = (log_decay - ref).exp() * ((ref - log_decay).exp() * inputs).cumsum(2)  # h_t from h_0 = 0

    # Carry across chunks: h_t += exp(S_t) h_before; exp(S_t) <= 1.
    decay_from_start = log_decay.exp()
    states_before = []
    h = u_t.new_zeros(batch, d_inner, d_state)
    for c, (decay_c, local_c) in enumerate(zip(decay_from_start.unbind(1), local.unbind(1))):
        states_before.append(h)
        if c + 1 < n_chunks or last_state:
            h = decay_c[:, -1] * h + local_c[:, -1]
    states = local + decay_from_start * torch.stack(states_before, 1).unsqueeze(2)
    return states.flatten(1, 2)[:, :length], h


def selective_scan_chunked(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    chunk_size: int | None = None,
):
    """The chunked parallel scan; see the module docstring. Shapes as mamba-ssm:
    u, delta, z (batch, d_inner, L); A (d_inner, d_state); B, C (batch, d_state, L) or
    (batch, groups, d_state, L) (channel d reads group d // (d_inner / groups));
    D, delta_bias (d_inner,). With `return_last_state`: (out, h_L (batch, d_inner,
    d_state)), no gradient through h_L. `chunk_size` caps the chunk (default 128)."""
    if A.is_complex() or B.dim() not in (3, 4) or C.dim() != B.dim():
        raise NotImplementedError(
            "selective_scan_chunked: real A and B, C of shape (batch, d_state, L) or (batch, groups, d_state, L) only"
        )
    dtype_in = u.dtype
    cdtype = compute_dtype(dtype_in)
    with torch.autocast(device_type=u.device.type, enabled=False):
        # Time before channels: (batch, L, d_inner) and (batch, L, groups, d_state).
        u_t, delta_t = (x.to(cdtype).transpose(1, 2) for x in (u, delta))
        B_t, C_t = (
            x.to(cdtype).movedim(-1, 1) if x.dim() == 4 else x.to(cdtype).transpose(1, 2).unsqueeze(2) for x in (B, C)
        )
        groups = B_t.shape[2]
        A = A.to(cdtype)
        if delta_bias is not None:
            delta_t = delta_t + delta_bias.to(cdtype)
        if delta_softplus:
            delta_t = F.softplus(delta_t)
        chunk = _largest_safe_chunk(delta_t, A, min(chunk_size or DEFAULT_CHUNK, u_t.shape[1]))
        states, h = _chunked_states(u_t, delta_t, A, B_t, chunk, return_last_state)

        # sum_n h_t[n] C_t[n], channel d with its group's C
        y = (states.unflatten(-2, (groups, -1)) @ C_t.unsqueeze(-1)).squeeze(-1).flatten(-2)
        if D is not None:
            y = y + u_t * D.to(cdtype)
        if z is not None:
            y = y * F.silu(z.to(cdtype).transpose(1, 2))
        out = y.transpose(1, 2).to(dtype_in)
    if not return_last_state:
        return out
    return out, h.detach()
