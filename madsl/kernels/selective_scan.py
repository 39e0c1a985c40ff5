"""Mamba's selective scan on the CPU: a fused recurrence with a hand-written backward.

Semantics are those of mamba-ssm's `selective_scan_ref` for real `A` and
input-dependent `B`, `C` (one group):

    delta  = softplus(delta + delta_bias)                 (if delta_softplus)
    h_t    = exp(delta_t * A) * h_{t-1} + delta_t * u_t * B_t      h_0 = 0
    y_t    = sum_n h_t[n] * C_t[n] + D * u_t
    out_t  = y_t * silu(z_t)

Shapes (mamba-ssm's layout): u, delta, z (batch, d_inner, L); A (d_inner, d_state);
B, C (batch, d_state, L); D, delta_bias (d_inner,). Any strides are accepted. Inputs
whose channel axis is contiguous are read in place: transposed views of
(batch, L, channels) tensors, which is what `madsl.layers.mamba.Mamba` passes;
contiguous (batch, channels, L) inputs are copied once. Outputs and input gradients
are (batch, channels, L) views of (batch, L, channels) storage.

Memory. Nothing of size (batch, L, d_inner, d_state) is ever allocated. Time is cut
into chunks of `chunk_len` steps (about 2^18 state elements per chunk); per chunk
the decays exp(delta*A) and the inputs delta*u*B are computed in one vectorized
op each, and the recurrence runs as one in-place fused multiply-add per step on a
(batch, d_inner, d_state) slice. Forward keeps only the state at the start of
each chunk (L/chunk_len states); backward recomputes each chunk's states from
there (one extra forward recurrence) and runs the reverse-time recurrence of the
state gradient. Saved for backward: the inputs, delta + bias, softplus of it and
y (each batch*L*d_inner) and the chunk start states; work buffers are
O(batch*d_inner*d_state*chunk_len).

`selective_scan` dispatches by device: this scan on the CPU; on CUDA mamba-ssm's
kernel, or without it the chunked parallel scan of `selective_scan_chunked` (the
step-by-step loop here would launch several kernels per time step on a GPU).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels import cuda
from madsl.kernels.selective_scan_chunked import selective_scan_chunked

# State elements (batch * d_inner * d_state * steps) held per chunk buffer. 2^18 (1 MiB of
# float32 per buffer, so the chunk's working set stays in cache) was the fastest of 2^17..2^20
# for a 4-layer width-128 model at batch 32 x 128, 128 x 128 and 8 x 1024: 8-11% faster
# training steps than 2^20 (benchmarks/selective_scan.py measures the scan itself).
_CHUNK_ELEMENTS = 1 << 18


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half types are scanned in float32, as selective_scan_ref does.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _time_major(x: Tensor, dtype: torch.dtype) -> Tensor:
    """(batch, channels, L) -> a (L, batch, channels) view; copies only to fix dtype or
    to make the channel axis contiguous (what the per-step ops vectorise over)."""
    x = x.to(dtype).permute(2, 0, 1)
    return x if x.stride(-1) == 1 else x.contiguous()


def _new_time_major(length: int, batch: int, channels: int, like: Tensor) -> Tensor:
    """An (L, batch, channels) view of fresh (batch, L, channels) storage, so that the
    result transposed back to (batch, channels, L) is a view of a (batch, L, channels)
    tensor: the layout the surrounding Linear layers consume without copies."""
    return like.new_empty(batch, length, channels).transpose(0, 1)


def _to_user_layout(x_time_major: Tensor) -> Tensor:
    return x_time_major.permute(1, 2, 0)  # (L, batch, channels) -> (batch, channels, L)


def _default_chunk_len(batch: int, d_inner: int, d_state: int, length: int) -> int:
    return max(1, min(length, _CHUNK_ELEMENTS // max(1, batch * d_inner * d_state)))


class _ChunkBuffers:
    """Preallocated per-chunk work buffers, reused by every chunk of one call.

    States are laid out (step, batch, d_state, d_inner): d_inner is contiguous in every
    elementwise op, so they vectorise (mamba-ssm's (.., d_state)-innermost layout gives
    inner loops of length d_state), and the contractions over d_state or d_inner are
    batched matmuls over the merged (step, batch) axis."""

    def __init__(self, chunk_len: int, batch: int, d_inner: int, d_state: int, like: Tensor,
                 with_grad: bool):
        shape = (batch, d_state, d_inner)
        self.decay = like.new_empty(chunk_len, *shape)  # exp(delta*A) per step
        self.states = like.new_empty(chunk_len + 1, *shape)  # [h_{start-1}, h_start, ...]
        self.decay_steps = self.decay.unbind(0)
        self.state_steps = self.states.unbind(0)
        if with_grad:
            self.grad_states = like.new_empty(chunk_len, *shape)  # dLoss/dh_t (total)
            self.grad_steps = self.grad_states.unbind(0)


def _recompute_chunk(buf: _ChunkBuffers, steps: int, delta_c: Tensor, delta_u_c: Tensor,
                     B_c: Tensor, A_T: Tensor, h_start: Tensor) -> None:
    """Fill buf.decay[:steps] and buf.states[:steps+1] for one chunk starting from h_start.
    delta_c, delta_u_c: (T, batch, d_inner); B_c: (T, batch, d_state); A_T: (d_state, d_inner)."""
    decay, states = buf.decay[:steps], buf.states[1:steps + 1]
    buf.states[0].copy_(h_start)  # first: h_start may alias the buffer's last state
    torch.mul(delta_c.unsqueeze(2), A_T, out=decay).exp_()
    torch.mul(delta_u_c.unsqueeze(2), B_c.unsqueeze(-1), out=states)  # delta*u*B
    decay_steps, state_steps = buf.decay_steps, buf.state_steps
    for t in range(steps):  # h_t = exp(delta_t A) h_{t-1} + delta_t u_t B_t, in place
        state_steps[t + 1].addcmul_(decay_steps[t], state_steps[t])


def _rows(x: Tensor) -> Tensor:
    """(T, batch, k) or (T, batch, d_state, d_inner) -> (T*batch, ...), for bmm."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


class SelectiveScanCPU(torch.autograd.Function):
    """The fused scan; see the module docstring. Use `selective_scan_cpu`."""

    @staticmethod
    def forward(ctx, u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                D: Tensor | None, z: Tensor | None, delta_bias: Tensor | None,
                delta_softplus: bool, return_last_state: bool, chunk_len: int | None):
        dtype_in = u.dtype
        cdtype = _compute_dtype(dtype_in)
        batch, d_inner, length = u.shape
        d_state = A.shape[1]
        A_T = A.to(cdtype).t().contiguous()
        u_t = _time_major(u, cdtype)
        B_t, C_t = _time_major(B, cdtype), _time_major(C, cdtype)
        z_t = _time_major(z, cdtype) if z is not None else None
        delta_pre = _new_time_major(length, batch, d_inner, u_t)  # delta + bias
        if delta_bias is not None:
            torch.add(_time_major(delta, cdtype), delta_bias.to(cdtype), out=delta_pre)
        else:
            delta_pre.copy_(_time_major(delta, cdtype))
        delta_t = F.softplus(delta_pre) if delta_softplus else delta_pre
        delta_u = delta_t * u_t

        T = chunk_len or _default_chunk_len(batch, d_inner, d_state, length)
        n_chunks = (length + T - 1) // T
        buf = _ChunkBuffers(min(T, length), batch, d_inner, d_state, u_t, with_grad=False)
        chunk_starts = u_t.new_empty(n_chunks, batch, d_state, d_inner)  # h before each chunk
        y = _new_time_major(length, batch, d_inner, u_t)  # sum_n h C (+ D u below)
        h = u_t.new_zeros(batch, d_state, d_inner)
        for c in range(n_chunks):
            t0, t1 = c * T, min(length, (c + 1) * T)
            chunk_starts[c].copy_(h)
            _recompute_chunk(buf, t1 - t0, delta_t[t0:t1], delta_u[t0:t1], B_t[t0:t1], A_T,
                             chunk_starts[c])
            states = buf.states[1:t1 - t0 + 1]
            y[t0:t1] = torch.bmm(_rows(C_t[t0:t1]).unsqueeze(1), _rows(states)).view(t1 - t0, batch, d_inner)
            h = buf.states[t1 - t0]
        if D is not None:
            y.addcmul_(u_t, D.to(cdtype))
        out = y * F.silu(z_t) if z_t is not None else y

        ctx.save_for_backward(u, delta_pre, delta_t, A, B, C, D, z, delta_bias, chunk_starts, y)
        ctx.meta = (delta_softplus, T, cdtype, delta.dtype)
        out = _to_user_layout(out).to(dtype_in)
        if not return_last_state:
            return out
        last_state = h.permute(0, 2, 1).contiguous()  # (batch, d_inner, d_state)
        ctx.mark_non_differentiable(last_state)
        return out, last_state

    @staticmethod
    def backward(ctx, grad_out: Tensor, *unused):
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            return SelectiveScanCPU._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out: Tensor):
        u, delta_pre, delta_t, A, B, C, D, z, delta_bias, chunk_starts, y = ctx.saved_tensors
        delta_softplus, T, cdtype, delta_dtype = ctx.meta
        batch, d_inner, length = u.shape
        d_state = A.shape[1]
        A_T = A.to(cdtype).t().contiguous()
        u_t = _time_major(u, cdtype)
        B_t, C_t = _time_major(B, cdtype), _time_major(C, cdtype)
        grad_out_t = _time_major(grad_out, cdtype)
        delta_u = delta_t * u_t

        # Output gate: out = y * silu(z).
        if z is not None:
            z_t = _time_major(z, cdtype)
            grad_y = grad_out_t * F.silu(z_t)
            grad_z_t = torch.ops.aten.silu_backward(grad_out_t * y, z_t)
        else:
            grad_y, grad_z_t = grad_out_t, None

        grad_u_t = _new_time_major(length, batch, d_inner, u_t)
        if D is not None:
            torch.mul(grad_y, D.to(cdtype), out=grad_u_t)
            grad_D = (grad_y * u_t).sum((0, 1))
        else:
            grad_u_t.zero_()
            grad_D = None
        grad_delta_t = _new_time_major(length, batch, d_inner, u_t)
        grad_B_t = _new_time_major(length, batch, d_state, u_t)
        grad_C_t = _new_time_major(length, batch, d_state, u_t)
        grad_A_T = torch.zeros_like(A_T)

        buf = _ChunkBuffers(min(T, length), batch, d_inner, d_state, u_t, with_grad=True)
        # exp(delta_{t+1} A) * dL/dh_{t+1}, flowing into the last step of the chunk before.
        carry = u_t.new_zeros(batch, d_state, d_inner)
        n_chunks = chunk_starts.shape[0]
        for c in reversed(range(n_chunks)):
            t0, t1 = c * T, min(length, (c + 1) * T)
            steps = t1 - t0
            delta_c, delta_u_c, B_c, C_c = delta_t[t0:t1], delta_u[t0:t1], B_t[t0:t1], C_t[t0:t1]
            grad_y_c = grad_y[t0:t1]
            _recompute_chunk(buf, steps, delta_c, delta_u_c, B_c, A_T, chunk_starts[c])
            decay = buf.decay[:steps]
            prev_states = buf.states[:steps]
            grad_h = buf.grad_states[:steps]

            # y_t = C_t . h_t  ->  dC_t = h_t dy_t  (sum over d_inner)
            states = _rows(buf.states[1:steps + 1])
            grad_C_t[t0:t1] = torch.bmm(states, _rows(grad_y_c).unsqueeze(-1)).view(steps, batch, d_state)

            # Reverse-time recurrence: G_t = dy_t C_t + exp(delta_{t+1} A) G_{t+1}.
            torch.mul(grad_y_c.unsqueeze(2), C_c.unsqueeze(-1), out=grad_h)
            grad_h[steps - 1].add_(carry)
            decay_steps, grad_steps = buf.decay_steps, buf.grad_steps
            for t in range(steps - 2, -1, -1):
                grad_steps[t].addcmul_(decay_steps[t + 1], grad_steps[t + 1])
            torch.mul(decay[0], grad_h[0], out=carry)

            # Decay a_t = exp(delta_t A): dL/d(delta_t A) = G_t * h_{t-1} * a_t.
            grad_log_decay = prev_states.mul_(decay).mul_(grad_h)  # overwrites h_{t-1}
            grad_delta_c = grad_delta_t[t0:t1]
            torch.mul(grad_log_decay[:, :, 0], A_T[0], out=grad_delta_c)
            for n in range(1, d_state):
                grad_delta_c.addcmul_(grad_log_decay[:, :, n], A_T[n])
            scratch = torch.mul(grad_log_decay, delta_c.unsqueeze(2), out=decay)  # decay is spent
            grad_A_T.add_(scratch.sum((0, 1)))

            # Input b_t = delta_t u_t B_t.
            grad_h_rows = _rows(grad_h)
            grad_B_t[t0:t1] = torch.bmm(grad_h_rows, _rows(delta_u_c).unsqueeze(-1)).view(steps, batch, d_state)
            grad_b_dot_B = torch.bmm(_rows(B_c).unsqueeze(1), grad_h_rows).view(steps, batch, d_inner)
            grad_u_t[t0:t1].addcmul_(grad_b_dot_B, delta_c)
            grad_delta_c.addcmul_(grad_b_dot_B, u_t[t0:t1])

        if delta_softplus:
            grad_delta_t = torch.ops.aten.softplus_backward(grad_delta_t, delta_pre, 1.0, 20.0)
        grad_bias = grad_delta_t.sum((0, 1)) if delta_bias is not None else None

        def user(x: Tensor, dtype: torch.dtype) -> Tensor:
            return _to_user_layout(x).to(dtype)

        return (user(grad_u_t, u.dtype), user(grad_delta_t, delta_dtype), grad_A_T.t().to(A.dtype),
                user(grad_B_t, B.dtype), user(grad_C_t, C.dtype),
                grad_D.to(D.dtype) if grad_D is not None else None,
                user(grad_z_t, z.dtype) if z is not None else None,
                grad_bias.to(delta_bias.dtype) if grad_bias is not None else None,
                None, None, None)


def selective_scan_cpu(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                       D: Tensor | None = None, z: Tensor | None = None,
                       delta_bias: Tensor | None = None, delta_softplus: bool = False,
                       return_last_state: bool = False, chunk_len: int | None = None):
    """The fused CPU scan (works on any device, but is meant for the CPU).

    Same arguments and result as mamba-ssm's `selective_scan_fn` (real A, B and C of
    shape (batch, d_state, L)). With `return_last_state` it returns (out, h_L); like
    mamba-ssm, no gradient flows through h_L. `chunk_len` overrides the chunk length.
    """
    if A.is_complex() or B.dim() != 3 or C.dim() != 3:
        raise NotImplementedError("selective_scan_cpu: real A and (batch, d_state, L) B, C only")
    # The scan is computed in float32 (float64) whatever autocast says (its bmm would run in
    # bf16); the backward disables autocast itself.
    with torch.autocast(device_type=u.device.type, enabled=False):
        return SelectiveScanCPU.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                      return_last_state, chunk_len)


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Tensor | None = None, z: Tensor | None = None,
                   delta_bias: Tensor | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False):
    """Dispatch. CUDA tensors: mamba-ssm's `selective_scan_fn` when it imports, else the
    chunked parallel scan (`selective_scan_chunked`, after a one-time warning naming the
    extra); never this module's step-by-step loop. Other devices: the fused CPU scan."""
    if u.is_cuda:
        cuda_scan = cuda.selective_scan_fn() if u.dtype != torch.float64 else None
        if cuda_scan is not None:
            return cuda_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
        return selective_scan_chunked(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    return selective_scan_cpu(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


def selective_scan_reference(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                             D: Tensor | None = None, z: Tensor | None = None,
                             delta_bias: Tensor | None = None, delta_softplus: bool = False,
                             return_last_state: bool = False):
    """The plain sequential recurrence, differentiated by autograd (tests and benchmarks
    only: autograd keeps every step's state, and every step costs several ops)."""
    dtype_in = u.dtype
    cdtype = _compute_dtype(dtype_in)
    u, delta, A, B, C = (x.to(cdtype) for x in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias.to(cdtype)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    batch, d_inner, length = u.shape
    h = u.new_zeros(batch, d_inner, A.shape[1])
    ys = []
    for t in range(length):
        delta_step = delta[:, :, t].unsqueeze(-1)
        h = torch.exp(delta_step * A) * h + delta_step * u[:, :, t, None] * B[:, None, :, t]
        ys.append(torch.matmul(h, C[:, :, t, None]).squeeze(-1))
    y = torch.stack(ys, dim=2)
    if D is not None:
        y = y + u * D.to(cdtype)[:, None]
    if z is not None:
        y = y * F.silu(z.to(cdtype))
    y = y.to(dtype_in)
    return (y, h) if return_last_state else y
