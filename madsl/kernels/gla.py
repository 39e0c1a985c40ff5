"""Gated linear attention (GLA, Yang et al. 2023) kernels: the recurrence and its chunked form.

Per head, with a key-dimensional log forget gate g_t <= 0 (alpha_t = exp(g_t)):

    S_t = diag(alpha_t) S_{t-1} + k_t v_t^T          S_0 = initial_state or 0
    o_t = S_t^T q_t                                  (q is used as given: the caller scales it)

Layout (head first): q, k, log_decay (batch, heads, L, key_dim); v (batch, heads, L,
value_dim); state (batch, heads, key_dim, value_dim). Every function returns
(o, final_state) with o of v's shape.

- `gla_recurrent`: the plain sequential recurrence, one step per token. The reference.
- `gla_chunked`: the chunked parallel form (pure PyTorch, autograd backward): the
  CPU path, and the GPU path when fla is not installed. Time is cut into chunks; inside a chunk the outputs are masked
  matmuls; the state is carried from chunk to chunk (L / chunk Python steps).
- `gla_fla_chunk`: flash-linear-attention's Triton chunk kernel (CUDA only;
  imported lazily, never at module import).

Numerics of the chunked form. With b the cumulative log gate inside a chunk
(b_t = g_1 + ... + g_t, non-increasing), the weight of key s in query t is
exp(b_t - b_s) <= 1 for s <= t. The intra-chunk sum becomes a matmul by factoring
it as exp(b_t - r) * exp(r - b_s), with r the middle of the chunk's range of b (per
channel), so that no factor exceeds exp(half the chunk's decay). Where a chunk decays
by more than the dtype can hold that way (float32: e^-140, i.e. a mean log gate
below -2.2 per step at chunk 64, a gate logit below about -35), the chunk is halved
until none does (down to 1, the recurrence itself): exact for any gates, and free
for ordinary ones. The carried state only ever sees factors <= 1.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels import cuda
from madsl.kernels.member_fold import folds_into_batch


def _full_precision(fn):
    """The recurrences run in the inputs' dtype with autocast off: under a bf16 autocast the
    matmuls would otherwise round the carried state and the cumulative gates to bf16."""

    @functools.wraps(fn)
    def wrapped(q: Tensor, *args, **kwargs):
        with torch.autocast(device_type=q.device.type, enabled=False):
            return fn(q, *args, **kwargs)

    return wrapped


@_full_precision
def gla_step(q_t: Tensor, k_t: Tensor, v_t: Tensor, log_decay_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token: q_t, k_t, log_decay_t (batch, heads, key_dim); v_t (batch, heads, value_dim);
    state (batch, heads, key_dim, value_dim). Returns (o_t (batch, heads, value_dim), new state)."""
    dtype = torch.promote_types(q_t.dtype, state.dtype)
    q_t, k_t, v_t, log_decay_t, state = (x.to(dtype) for x in (q_t, k_t, v_t, log_decay_t, state))
    state = log_decay_t.exp().unsqueeze(-1) * state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    o_t = (q_t.unsqueeze(-2) @ state).squeeze(-2)
    return o_t, state


@_full_precision
def gla_recurrent(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The sequential recurrence, token by token (reference; O(L) Python steps)."""
    batch, heads, length, key_dim = q.shape
    state = initial_state if initial_state is not None else q.new_zeros(batch, heads, key_dim, v.shape[-1])
    outputs = []
    for t in range(length):
        o_t, state = gla_step(q[:, :, t], k[:, :, t], v[:, :, t], log_decay[:, :, t], state)
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), state


def _safe_exponent(dtype: torch.dtype) -> float:
    """|x| up to which exp(x) is a normal number of `dtype` with room for the magnitude of
    q and k (float32: 69.8, float64: 567)."""
    return -0.8 * math.log(torch.finfo(dtype).tiny)


def default_chunk_size(key_dim: int, value_dim: int) -> int:
    """Chunk length for `gla_chunked`. Per token, intra-chunk work grows with the chunk
    (chunk x (key_dim + value_dim)) and the carried states shrink with it (key_dim x
    value_dim per chunk, element-wise work and a Python step each): measured on the
    CPU, 64 suits small heads (mAlg: 16 x 16) and 128 large ones (Alg: 128 x 128)."""
    return 64 if key_dim * value_dim <= 64 * 64 else 128


def _largest_safe_chunk(log_decay: Tensor, chunk: int) -> int:
    """Halve `chunk` until no chunk decays, after its first step, by more than twice the
    dtype's safe exponent (what the factorisation in `gla_chunked` needs); chunk 1 is
    always safe."""
    limit = 2 * _safe_exponent(log_decay.dtype)
    length = log_decay.shape[-2]
    with torch.no_grad():
        while chunk > 1:
            padded = -(-length // chunk) * chunk
            g = F.pad(log_decay, (0, 0, 0, padded - length)).unflatten(-2, (padded // chunk, chunk))
            if -g[..., 1:, :].sum(-2).min() <= limit:
                break
            chunk //= 2
    return chunk


def _in_chunks(chunk: int, *xs: Tensor) -> tuple[Tensor, ...]:
    """(.., length, d) -> (.., n_chunks, chunk, d), zero-padded to whole chunks. Padding: k = v = 0
    adds nothing to the state, g = 0 does not decay it, so outputs and the final state are those
    of the unpadded sequence."""
    length = xs[0].shape[-2]
    padded = -(-length // chunk) * chunk
    if padded != length:
        xs = tuple(F.pad(x, (0, 0, 0, padded - length)) for x in xs)
    return tuple(x.unflatten(-2, (padded // chunk, chunk)) for x in xs)


@folds_into_batch  # under vmap one call for all members (its chunk choice reads the data)
@_full_precision
def gla_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_decay: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Chunked parallel form; equal to `gla_recurrent` up to rounding, for any gate values.
    `chunk_size` None: `default_chunk_size`. Sequences shorter than a chunk use one chunk."""
    if q.dtype in (torch.float16, torch.bfloat16):  # cumulative gates need float32's mantissa
        out, final_state = gla_chunked(
            q.float(),
            k.float(),
            v.float(),
            log_decay.float(),
            None if initial_state is None else initial_state.float(),
            chunk_size,
        )
        return out.to(v.dtype), final_state.to(v.dtype)
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    chunk = min(chunk_size or default_chunk_size(key_dim, value_dim), length)
    chunk = _largest_safe_chunk(log_decay, chunk)
    q, k, v, log_decay = _in_chunks(chunk, q, k, v, log_decay)
    n_chunks = q.shape[-3]
    padded = n_chunks * chunk

    b = log_decay.cumsum(dim=-2)  # cumulative log gate within each chunk, non-increasing
    b_last = b[..., -1:, :]
    # Reference point: the middle of each chunk's (and channel's) range [b_last, b_first],
    # so that |b_t - ref| <= limit for every t (see _largest_safe_chunk).
    ref = 0.5 * (b[..., :1, :] + b_last)
    # Two exps rather than a division by one: the division's gradient, 1 / rel^2, would overflow.
    q_in = q * (b - ref).exp()  # q_t exp(b_t - ref)
    k_in = k * (ref - b).exp()  # k_s exp(ref - b_s)
    # Intra-chunk: scores[t, s] = sum_k q_t k_s exp(b_t - b_s) for s <= t.
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    scores = (q_in @ k_in.transpose(-1, -2)).masked_fill(~causal, 0.0)
    out = scores @ v

    # Inter-chunk: the state carried in decays to t by exp(b_t); each chunk adds
    # sum_s exp(b_last - b_s) k_s v_s^T and decays what it carries by exp(b_last).
    chunk_updates = (k_in * (b_last - ref).exp()).transpose(-1, -2) @ v  # (.., n_chunks, key_dim, value_dim)
    chunk_decay = b_last.exp().transpose(-1, -2)  # (.., n_chunks, key_dim, 1)
    if n_chunks == 1 and initial_state is None:
        final_state = chunk_updates[:, :, 0]  # nothing carried in: skip reading out a zero state
    else:
        state = initial_state if initial_state is not None else q.new_zeros(batch, heads, key_dim, value_dim)
        states_before = []
        # unbind, not indexing: one backward node for all chunks (each index's backward
        # would write a full-size zero gradient, quadratic in the number of chunks).
        for decay, update in zip(chunk_decay.unbind(2), chunk_updates.unbind(2)):
            states_before.append(state)
            state = decay * state + update
        final_state = state
        out = out + (q * b.exp()) @ torch.stack(states_before, dim=2)
    out = out.reshape(batch, heads, padded, value_dim)[:, :, :length]
    return out, final_state


def fla_chunk_gla():
    """flash-linear-attention's `chunk_gla`, or None (after a one-time warning naming the
    extra) when fla does not import. Only asked for CUDA tensors."""
    return cuda.chunk_gla()


def fla_applies(x: Tensor) -> bool:
    """Whether fla's `chunk_gla` serves `x`: a CUDA tensor of a dtype it takes (not float64),
    with fla installed. Its chunks are stable for any decays (sub-chunks referenced at their
    start, explicit exponentials within), and it reads nothing on the host."""
    return x.is_cuda and x.dtype != torch.float64 and fla_chunk_gla() is not None


def fla_operands(
    keys: list[Tensor | None], values: list[Tensor | None], floats: list[Tensor | None] = ()
) -> tuple[list, list, list, int]:
    """Tensors as fla's chunk kernels take them, and the value width to cut the output back to.
    - keys (q, k, and GLA's per-key gates: last axis the key width) and values (last axis the
      value width) in one dtype: the kernels' dots take operands of one type, and under autocast
      a projection's bf16 meets a float32 product (Mamba-2's x·dt). The autocast dtype where
      autocast is on, else the widest of them. Gates that fla keeps in float32 come in `floats`;
    - in 16 bits, even key and value widths, padded with zeros: fla asserts it (Triton miscompiles
      an odd 16-bit tail), and normalised linear attention's value width is head_dim + 1. A zero
      key column adds nothing to any q·k or state; a zero value column is an output column cut off.
    None stays None."""
    present = [x for x in (*keys, *values) if x is not None]
    dtypes = {x.dtype for x in present}
    device = present[0].device.type
    if len(dtypes) == 1:
        dtype = dtypes.pop()
    elif torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = functools.reduce(torch.promote_types, dtypes)

    sixteen_bits = dtype in (torch.float16, torch.bfloat16)

    def pad(xs: list, cast: bool) -> list:  # tensors of one width (the key or the value width)
        return [
            None if x is None else F.pad(x.to(dtype) if cast else x, (0, x.shape[-1] % 2 if sixteen_bits else 0))
            for x in xs
        ]

    value_width = next(x.shape[-1] for x in values if x is not None)
    return pad(keys, True), pad(values, True), pad(list(floats), False), value_width


@folds_into_batch  # fla's kernels have no vmap rule
def gla_fla_chunk(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """fla's Triton chunk kernel on CUDA tensors (same layout and semantics as above).
    fla takes (batch, L, heads, dim); versions that still have `head_first` (whose default
    changed over time) get head_first=False explicitly. q is already scaled: scale=1.
    fla keeps the cumulative gates and the backward's states in float32 itself; it wants
    a float32 initial state. Operands as `fla_operands` makes them."""
    chunk_gla = fla_chunk_gla()
    if chunk_gla is None:
        raise RuntimeError(f"flash-linear-attention is not installed ({cuda.EXTRA_HINT})")
    key_width = q.shape[-1]
    (q, k), [v], [log_decay], value_width = fla_operands([q, k], [v], [log_decay])
    if initial_state is not None:
        initial_state = F.pad(initial_state.float(), (0, v.shape[-1] - value_width, 0, q.shape[-1] - key_width))
    kwargs: dict = {"scale": 1.0, "initial_state": initial_state, "output_final_state": True}
    if "head_first" in inspect.signature(chunk_gla).parameters:
        kwargs["head_first"] = False
    q, k, v, log_decay = (x.transpose(1, 2).contiguous() for x in (q, k, v, log_decay))
    result = chunk_gla(q, k, v, log_decay, **kwargs)
    o, final_state = result if isinstance(result, tuple) else (result, None)
    if final_state is not None:
        final_state = final_state[..., :key_width, :value_width]
    return o[..., :value_width].transpose(1, 2), final_state
