"""Gated linear attention (GLA, Yang et al. 2023) kernels: the recurrence and its chunked form.

Per head, with a key-dimensional log forget gate g_t <= 0 (alpha_t = exp(g_t)):

    S_t = diag(alpha_t) S_{t-1} + k_t v_t^T          S_0 = initial_state or 0
    o_t = S_t^T q_t                                  (q is used as given: the caller scales it)

Layout (head first): q, k, log_decay (batch, heads, L, key_dim); v (batch, heads, L,
value_dim); state (batch, heads, key_dim, value_dim). Every function returns
(o, final_state) with o of v's shape.

- `gla_recurrent`: the plain sequential recurrence, one step per token. The reference.
- `gla_chunked`: the chunked parallel form for the CPU (pure PyTorch, autograd
  backward). Time is cut into chunks of `chunk_size`; inside a chunk the outputs
  are masked matmuls; the state is carried from chunk to chunk.
- `gla_fla_chunk`: flash-linear-attention's Triton chunk kernel (CUDA only;
  imported lazily, never at module import).

Numerics of the chunked form. With b the cumulative log gate inside a chunk
(b_t = g_1 + ... + g_t, non-increasing), the weight of key s in query t is
exp(b_t - b_s) <= 1 for s <= t. Factoring it as exp(b_t - r) * exp(r - b_s) turns
the intra-chunk sum into a matmul, but each factor alone can overflow or underflow
when the gates decay fast (exp(-b_s) alone overflows float32 once the chunk has
decayed by e^-88). The chunk is therefore cut further into sub-chunks of
`sub_chunk_size`, and the rows of sub-chunk i use r = b at the start of sub-chunk i:
for keys in earlier sub-chunks both factors are <= 1 (always safe); only keys in
the query's own sub-chunk see a factor >= 1, bounded by the decay across one
sub-chunk. If that decay exceeds what the dtype can hold, those diagonal blocks
are computed exactly from exp(b_t - b_s) elementwise (slower, but never wrong).
The state update uses exp(b_last - b_s) <= 1 and exp(b_t) <= 1 only.
"""
from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor


def gla_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, log_decay_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token: q_t, k_t, log_decay_t (batch, heads, key_dim); v_t (batch, heads, value_dim);
    state (batch, heads, key_dim, value_dim). Returns (o_t (batch, heads, value_dim), new state)."""
    state = log_decay_t.exp().unsqueeze(-1) * state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    o_t = (q_t.unsqueeze(-2) @ state).squeeze(-2)
    return o_t, state


def gla_recurrent(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                  initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The sequential recurrence, token by token (reference; O(L) Python steps)."""
    batch, heads, length, key_dim = q.shape
    state = (initial_state if initial_state is not None
             else q.new_zeros(batch, heads, key_dim, v.shape[-1]))
    outputs = []
    for t in range(length):
        o_t, state = gla_step(q[:, :, t], k[:, :, t], v[:, :, t], log_decay[:, :, t], state)
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), state


def _safe_exponent(dtype: torch.dtype) -> float:
    """Largest x such that exp(x) and exp(-x) are normal numbers of `dtype`, with margin."""
    return -math.log(torch.finfo(dtype).tiny) - 8.0


def gla_chunked(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                initial_state: Tensor | None = None,
                chunk_size: int = 64, sub_chunk_size: int = 16) -> tuple[Tensor, Tensor]:
    """Chunked parallel form; equal to `gla_recurrent` up to rounding, for any gate values."""
    if chunk_size % sub_chunk_size:
        raise ValueError(f"chunk_size={chunk_size} must be a multiple of sub_chunk_size={sub_chunk_size}")
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    # Short sequences use one chunk rounded up to whole sub-chunks rather than a full chunk.
    sub = min(sub_chunk_size, length)
    chunk = min(chunk_size, -(-length // sub) * sub)
    padded = -(-length // chunk) * chunk
    if padded != length:
        # Padding: k = v = 0 adds nothing to the state, g = 0 does not decay it,
        # so outputs and the final state are those of the unpadded sequence.
        pad = (0, 0, 0, padded - length)
        q, k, v, log_decay = (F.pad(x, pad) for x in (q, k, v, log_decay))
    n_chunks, n_sub = padded // chunk, chunk // sub
    shape = (batch, heads, n_chunks, chunk)
    q, k, v = q.reshape(*shape, key_dim), k.reshape(*shape, key_dim), v.reshape(*shape, value_dim)
    b = log_decay.reshape(*shape, key_dim).cumsum(dim=-2)  # cumulative log gate within each chunk
    b_last = b[..., -1, :]  # (batch, heads, n_chunks, key_dim)

    # ---- intra-chunk: A[t, s] = sum_k q_t k_s exp(b_t - b_s), s <= t ----------------------------
    b_sub = b.view(*shape[:3], n_sub, sub, key_dim)
    ref = b_sub[..., 0, :]  # b at the first position of each sub-chunk: (.., n_sub, key_dim)
    q_in = q.view_as(b_sub) * (b_sub - ref.unsqueeze(-2)).exp()  # factors <= 1
    # Row block i scales every key s of the chunk by exp(ref_i - b_s): (.., n_sub, chunk, key_dim).
    key_exponent = ref.unsqueeze(-2) - b.unsqueeze(-3)
    key_block = torch.arange(chunk, device=q.device) // sub
    row_block = torch.arange(n_sub, device=q.device)
    within_sub_decay = (ref - b_sub[..., -1, :]).amax() if sub > 1 else b.new_zeros(())
    exact_diagonal = bool(within_sub_decay > _safe_exponent(q.dtype))
    if exact_diagonal:
        # Keys in the query's own sub-chunk would overflow: leave them to the exact path below.
        hidden = key_block[None, :] >= row_block[:, None]
    else:
        hidden = key_block[None, :] > row_block[:, None]
    key_exponent = key_exponent.masked_fill(hidden.unsqueeze(-1), -math.inf)
    k_in = k.unsqueeze(-3) * key_exponent.exp()
    scores = (q_in @ k_in.transpose(-1, -2)).reshape(*shape, chunk)  # (.., chunk t, chunk s)
    if exact_diagonal:
        k_sub = k.view_as(b_sub)
        causal_sub = torch.ones(sub, sub, dtype=torch.bool, device=q.device).tril()
        rel = (b_sub.unsqueeze(-2) - b_sub.unsqueeze(-3)).masked_fill(~causal_sub.unsqueeze(-1), -math.inf)
        diag = (q.view_as(b_sub).unsqueeze(-2) * k_sub.unsqueeze(-3) * rel.exp()).sum(-1)  # (.., n_sub, t, s)
        eye = torch.eye(n_sub, dtype=q.dtype, device=q.device)
        scores = scores + (diag.unsqueeze(-2) * eye[:, None, :, None]).reshape(*shape, chunk)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, 0.0)
    out = scores @ v

    # ---- inter-chunk: carry the state across chunks ----------------------------------------------
    k_to_end = k * (b_last.unsqueeze(-2) - b).exp()  # decay from s to the end of its chunk, <= 1
    chunk_updates = k_to_end.transpose(-1, -2) @ v  # (.., n_chunks, key_dim, value_dim)
    chunk_decay = b_last.exp().unsqueeze(-1)  # (.., n_chunks, key_dim, 1)
    state = (initial_state if initial_state is not None
             else q.new_zeros(batch, heads, key_dim, value_dim))
    if n_chunks == 1 and initial_state is None:
        final_state = chunk_updates[:, :, 0]  # nothing carried in: skip the readout of a zero state
    else:
        states_before = []
        for n in range(n_chunks):
            states_before.append(state)
            state = chunk_decay[:, :, n] * state + chunk_updates[:, :, n]
        final_state = state
        q_from_start = q * b.exp()  # decay from the chunk start to t, <= 1
        out = out + q_from_start @ torch.stack(states_before, dim=2)
    out = out.reshape(batch, heads, padded, value_dim)[:, :, :length]
    return out, final_state


@functools.lru_cache(maxsize=1)
def fla_chunk_gla():
    """flash-linear-attention's `chunk_gla`, or None when fla is not installed."""
    try:
        from fla.ops.gla import chunk_gla
    except Exception:  # ImportError, or a broken Triton install
        return None
    return chunk_gla


def gla_fla_chunk(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor,
                  initial_state: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """fla's Triton chunk kernel on CUDA tensors (same layout and semantics as above).
    fla versions differ in the default layout (`head_first`), so it is passed explicitly
    where the installed version has it; q is already scaled, hence scale=1."""
    chunk_gla = fla_chunk_gla()
    if chunk_gla is None:
        raise RuntimeError("flash-linear-attention is not installed (pip install flash-linear-attention)")
    params = inspect.signature(chunk_gla).parameters
    kwargs: dict = {"scale": 1.0, "initial_state": initial_state, "output_final_state": True}
    if "head_first" in params:
        kwargs["head_first"] = True
        result = chunk_gla(q, k, v, log_decay, **kwargs)
        o, final_state = result if isinstance(result, tuple) else (result, None)
        return o, final_state
    # Newer versions take (batch, L, heads, dim) only.
    q, k, v, log_decay = (x.transpose(1, 2).contiguous() for x in (q, k, v, log_decay))
    result = chunk_gla(q, k, v, log_decay, **kwargs)
    o, final_state = result if isinstance(result, tuple) else (result, None)
    return o.transpose(1, 2), final_state
