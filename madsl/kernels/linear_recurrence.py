"""Linear recurrences with one decay per head and token, and the delta rule: step and chunked forms.

Two recurrences, per head, with a scalar log decay g_t <= 0 (alpha_t = exp(g_t); None: no decay):

    decayed linear attention (Mamba-2's SSD, RetNet's retention, linear attention):
        S_t = alpha_t S_{t-1} + k_t v_t^T
    the (gated) delta rule (DeltaNet; Gated DeltaNet with the decay), with a write strength beta_t:
        S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T

and the readout o_t = S_t^T q_t (q used as given: the caller scales it). Layout (head first):
q, k (batch, heads, L, key_dim); v (batch, heads, L, value_dim); log_decay, beta (batch, heads, L);
state (batch, heads, key_dim, value_dim). Every function returns (o, final_state).

The chunked forms cut time into chunks: inside a chunk the outputs are masked matmuls, and the
state is carried from chunk to chunk (L / chunk Python steps). With a scalar decay the weight of
key s in query t is exp(b_t - b_s) for the cumulative log decay b, written out as a (chunk x
chunk) matrix with -inf above the diagonal before the exp: no factor exceeds 1, for any decay.

The delta rule's chunk form (the WY / UT transform of Yang et al. 2024). Writing the update as
S_t = alpha_t S_{t-1} + k_t u_t^T with the "pseudo-value" u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)
makes it a decayed linear attention in (k, u). Inside a chunk that starts from state S_0,

    u_t = beta_t (v_t - exp(b_t) S_0^T k_t - sum_{s<t} exp(b_t - b_s) (k_t . k_s) u_s),

a unit lower-triangular system (I + A) U = beta (V - exp(b) K S_0) with
A[t, s] = beta_t exp(b_t - b_s) k_t . k_s (s < t). With T = (I + A)^{-1}, U = T beta V - T beta
exp(b) K S_0: both T-products are computed for all chunks at once (one triangular solve), and
only U = U_v - W S_0 and the readout run chunk by chunk.

The layers train through `decay_parallel` / `delta_parallel`: flash-linear-attention's Triton
kernels (`chunk_simple_gla`, `chunk_delta_rule`, `chunk_gated_delta_rule`) on CUDA when the
`cuda` extra is installed, the chunked forms here everywhere else (the CPU, float64, and CUDA
without the extra, after a one-time warning naming it).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels import cuda
from madsl.kernels.gla import fla_operands
from madsl.kernels.member_fold import folds_into_batch


def full_precision(fn):
    """Run in the inputs' dtype with autocast off (bf16 autocast would round the carried state and
    the cumulative decays); half-precision inputs are computed in float32 and cast back."""

    @functools.wraps(fn)
    def wrapped(q: Tensor, *args, **kwargs):
        with torch.autocast(device_type=q.device.type, enabled=False):
            if q.dtype in (torch.float16, torch.bfloat16):

                def lift(t):
                    return t.float() if isinstance(t, Tensor) and t.is_floating_point() else t

                out, state = fn(lift(q), *(lift(a) for a in args), **{k: lift(v) for k, v in kwargs.items()})
                return out.to(q.dtype), state
            return fn(q, *args, **kwargs)

    return wrapped


def _chunks(length: int, chunk_size: int) -> tuple[int, int]:
    chunk = max(1, min(chunk_size, length))
    return chunk, -(-length // chunk) * chunk


def _split(x: Tensor, padded: int, chunk: int) -> Tensor:
    """(batch, heads, L, ...) -> (batch, heads, n_chunks, chunk, ...), zero-padded at the end.
    Padding adds nothing: k = v = beta = 0 write nothing and g = 0 does not decay."""
    length = x.shape[2]
    if padded != length:
        pad = [0, 0] * (x.dim() - 3) + [0, padded - length]
        x = F.pad(x, pad)
    return x.unflatten(2, (padded // chunk, chunk))


def _decay_within(log_decay: Tensor) -> tuple[Tensor, Tensor]:
    """Cumulative log decay b (.., n_chunks, chunk) and the weights exp(b_t - b_s) for s <= t, 0 above."""
    b = log_decay.cumsum(-1)
    chunk = b.shape[-1]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=b.device).tril()
    weights = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    return b, weights


# ---- decayed linear attention ---------------------------------------------------------------------


@full_precision
def decay_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, log_decay_t: Tensor | None, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token: q_t, k_t (batch, heads, key_dim); v_t (batch, heads, value_dim); log_decay_t
    (batch, heads) or None. Returns (o_t, new state)."""
    decayed = state if log_decay_t is None else log_decay_t.exp()[..., None, None] * state
    state = decayed + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    return (q_t.unsqueeze(-2) @ state).squeeze(-2), state


@full_precision
def decay_recurrent(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The sequential recurrence, token by token (the reference)."""
    state = initial_state if initial_state is not None else q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    outputs = []
    for t in range(q.shape[2]):
        o_t, state = decay_step(
            q[:, :, t], k[:, :, t], v[:, :, t], None if log_decay is None else log_decay[:, :, t], state
        )
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), state


@full_precision
def decay_chunked(
    q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None, initial_state: Tensor | None = None, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Chunked parallel form of `decay_recurrent` (equal up to rounding, for any decay)."""
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    if log_decay is None:
        log_decay = q.new_zeros(batch, heads, length)
    chunk, padded = _chunks(length, chunk_size)
    q, k, v, log_decay = (_split(x, padded, chunk) for x in (q, k, v, log_decay))
    b, weights = _decay_within(log_decay)  # (B, H, N, C), (B, H, N, C, C)
    out = ((q @ k.transpose(-1, -2)) * weights) @ v
    b_last = b[..., -1:]
    updates = (k * (b_last - b).exp().unsqueeze(-1)).transpose(-1, -2) @ v  # (B, H, N, key_dim, value_dim)
    state = initial_state if initial_state is not None else q.new_zeros(batch, heads, key_dim, value_dim)
    states_before = []
    for decay, update in zip(b_last.exp().unsqueeze(-1).unbind(2), updates.unbind(2)):
        states_before.append(state)
        state = decay * state + update
    out = out + (q * b.exp().unsqueeze(-1)) @ torch.stack(states_before, dim=2)
    return out.flatten(2, 3)[:, :, :length], state


# ---- the delta rule -------------------------------------------------------------------------------


@full_precision
def delta_step(
    q_t: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor, log_decay_t: Tensor | None, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token of the (gated) delta rule: beta_t (batch, heads); the rest as `decay_step`."""
    if log_decay_t is not None:
        state = log_decay_t.exp()[..., None, None] * state
    predicted = (k_t.unsqueeze(-2) @ state).squeeze(-2)  # S^T k: what the memory holds under k
    written = beta_t.unsqueeze(-1) * (v_t - predicted)
    state = state + k_t.unsqueeze(-1) * written.unsqueeze(-2)
    return (q_t.unsqueeze(-2) @ state).squeeze(-2), state


@full_precision
def delta_recurrent(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The sequential delta rule, token by token (the reference)."""
    state = initial_state if initial_state is not None else q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    outputs = []
    for t in range(q.shape[2]):
        o_t, state = delta_step(
            q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], None if log_decay is None else log_decay[:, :, t], state
        )
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), state


@full_precision
def delta_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    log_decay: Tensor | None,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Chunked (WY) form of `delta_recurrent` (see the module docstring)."""
    batch, heads, length, key_dim = q.shape
    value_dim = v.shape[-1]
    if log_decay is None:
        log_decay = q.new_zeros(batch, heads, length)
    chunk, padded = _chunks(length, chunk_size)
    q, k, v, beta, log_decay = (_split(x, padded, chunk) for x in (q, k, v, beta, log_decay))
    b, weights = _decay_within(log_decay)
    scaled_k = beta.unsqueeze(-1) * k
    strict = (scaled_k @ k.transpose(-1, -2)) * weights.tril(-1)  # A[t, s], s < t
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    rhs = torch.cat((beta.unsqueeze(-1) * v, scaled_k * b.exp().unsqueeze(-1)), dim=-1)
    solved = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)
    u_v, w = solved.split((value_dim, key_dim), dim=-1)  # U = u_v - w S_0

    scores = (q @ k.transpose(-1, -2)) * weights
    q_decayed = q * b.exp().unsqueeze(-1)
    b_last = b[..., -1:]
    k_to_end = k * (b_last - b).exp().unsqueeze(-1)
    state = initial_state if initial_state is not None else q.new_zeros(batch, heads, key_dim, value_dim)
    outputs = []
    # unbind, not indexing: one backward node per tensor (an index's backward writes a full-size gradient)
    for u_v_n, w_n, q_n, scores_n, decay_n, k_n in zip(
        u_v.unbind(2),
        w.unbind(2),
        q_decayed.unbind(2),
        scores.unbind(2),
        b_last.exp().unsqueeze(-1).unbind(2),
        k_to_end.transpose(-1, -2).unbind(2),
    ):
        u = u_v_n - w_n @ state
        outputs.append(q_n @ state + scores_n @ u)
        state = decay_n * state + k_n @ u
    out = torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :length]
    return out, state


# ---- the training forms: fla's Triton kernels on CUDA, the chunked forms elsewhere -------------------
def _fla_applies(q: Tensor) -> bool:
    """fla's kernels take CUDA tensors in float32 / bf16 / fp16 (never float64: the exact paths)."""
    return q.is_cuda and q.dtype != torch.float64


def _heads_second(*xs: Tensor | None) -> list[Tensor | None]:
    """madsl's (batch, heads, L, ...) -> fla's (batch, L, heads, ...)."""
    return [None if x is None else x.transpose(1, 2).contiguous() for x in xs]


@folds_into_batch  # under vmap one call for all members: fla's kernels have no vmap rule
def decay_parallel(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor | None, chunk_size: int = 64) -> Tensor:
    """o of `decay_recurrent` from a zero state: fla's `chunk_simple_gla` on CUDA when installed
    (q as given: scale 1; the log decay per head and token is its `g`), else `decay_chunked`."""
    if _fla_applies(q):
        chunk_simple_gla = cuda.fla_op("simple_gla", "chunk_simple_gla", "madsl's chunked decay form")
        if chunk_simple_gla is not None:
            (q_, k_), [v_], _, value_width = fla_operands([q, k], [v])
            q_, k_, v_, g = _heads_second(q_, k_, v_, log_decay)
            o, _ = chunk_simple_gla(q_, k_, v_, g=None if g is None else g.float(), scale=1.0)
            return o[..., :value_width].transpose(1, 2)
    return decay_chunked(q, k, v, log_decay, chunk_size=chunk_size)[0]


@folds_into_batch
def delta_parallel(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor | None, chunk_size: int = 64
) -> Tensor:
    """o of `delta_recurrent` from a zero state: fla's `chunk_gated_delta_rule` (with a decay) or
    `chunk_delta_rule` on CUDA when installed (k already L2-normalised, q as given: scale 1), else
    `delta_chunked`."""
    if _fla_applies(q):
        if log_decay is None and q.dtype == torch.float32:
            # fla's chunk_delta_rule refuses float32 (an assertion, fla 0.6); the gated kernel takes
            # it, and with a zero log decay it is the same recurrence
            log_decay = q.new_zeros(q.shape[:-1])
        name = "chunk_delta_rule" if log_decay is None else "chunk_gated_delta_rule"
        kernel = cuda.fla_op("delta_rule" if log_decay is None else "gated_delta_rule", name, "madsl's chunked WY form")
        if kernel is not None:
            (q_, k_), [v_], _, value_width = fla_operands([q, k], [v])
            q_, k_, v_, beta_, g = _heads_second(q_, k_, v_, beta.to(q_.dtype), log_decay)
            if g is None:
                o, _ = kernel(q_, k_, v_, beta_, scale=1.0)
            else:
                o, _ = kernel(q_, k_, v_, g.float(), beta_, scale=1.0)
            return o[..., :value_width].transpose(1, 2)
    return delta_chunked(q, k, v, beta, log_decay, chunk_size=chunk_size)[0]
