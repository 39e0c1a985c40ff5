"""Mamba's selective scan on the CPU: a fused recurrence with a hand-written backward.

Semantics are those of mamba-ssm's `selective_scan_ref` for real `A` and
input-dependent `B`, `C` (one group):

    delta  = softplus(delta + delta_bias)                 (if delta_softplus)
    h_t    = exp(delta_t * A) * h_{t-1} + delta_t * u_t * B_t      h_0 = 0
    y_t    = sum_n h_t[n] * C_t[n] + D * u_t
    out_t  = y_t * silu(z_t)

Shapes (mamba-ssm's layout): u, delta, z (batch, d_inner, L); A (d_inner, d_state);
B, C (batch, d_state, L), or grouped (batch, groups, d_state, L) as mamba-ssm takes them
(channel d reads group d // (d_inner / groups): the members of a stacked model, folded
into the channels, each read their own B and C); D, delta_bias (d_inner,). Any strides are accepted. Inputs
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

`selective_scan` (madsl/kernels/selective_scan.py) dispatches by device: this scan on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from madsl.kernels.precision import compute_dtype

# State elements (batch * d_inner * d_state * steps) held per chunk buffer. 2^18 (1 MiB of
# float32 per buffer, so the chunk's working set stays in cache) was the fastest of 2^17..2^20
# for a 4-layer width-128 model at batch 32 x 128, 128 x 128 and 8 x 1024: 8-11% faster
# training steps than 2^20 (benchmarks/selective_scan.py measures the scan itself).
_CHUNK_ELEMENTS = 1 << 18


def _time_major(x: Tensor, dtype: torch.dtype) -> Tensor:
    """(batch, ..., L) -> a (L, batch, ...) view; copies only to fix dtype or to make the
    last axis contiguous (what the per-step ops vectorise over)."""
    x = x.to(dtype).movedim(-1, 0)
    return x if x.stride(-1) == 1 else x.contiguous()


def grouped_bc(BC: Tensor) -> Tensor:
    """B or C as (batch, groups, d_state, L): one group where it is (batch, d_state, L)."""
    return BC.unsqueeze(1) if BC.dim() == 3 else BC


def _new_time_major(length: int, batch: int, *channels: int, like: Tensor) -> Tensor:
    """An (L, batch, *channels) view of fresh (batch, L, *channels) storage, so that the
    result moved back to (batch, *channels, L) is a view of a (batch, L, *channels)
    tensor: the layout the surrounding Linear layers consume without copies."""
    return like.new_empty(batch, length, *channels).transpose(0, 1)


def _to_user_layout(x_time_major: Tensor) -> Tensor:
    return x_time_major.movedim(0, -1)  # (L, batch, ...) -> (batch, ..., L)


def _default_chunk_len(batch: int, d_inner: int, d_state: int, length: int) -> int:
    return max(1, min(length, _CHUNK_ELEMENTS // max(1, batch * d_inner * d_state)))


class _ChunkBuffers:
    """Preallocated per-chunk work buffers, reused by every chunk of one call.

    States are laid out (step, batch, groups, d_state, d_inner / groups): the channels are
    contiguous in every elementwise op, so they vectorise (mamba-ssm's (.., d_state)-innermost
    layout gives inner loops of length d_state), and the contractions over d_state or the
    channels are batched matmuls over the merged (step, batch, groups) axis."""

    def __init__(
        self, chunk_len: int, batch: int, groups: int, d_state: int, group_width: int, like: Tensor, with_grad: bool
    ):
        shape = (batch, groups, d_state, group_width)
        self.decay = like.new_empty(chunk_len, *shape)  # exp(delta*A) per step
        self.states = like.new_empty(chunk_len + 1, *shape)  # [h_{start-1}, h_start, ...]
        self.decay_steps = self.decay.unbind(0)
        self.state_steps = self.states.unbind(0)
        if with_grad:
            self.grad_states = like.new_empty(chunk_len, *shape)  # dLoss/dh_t (total)
            self.grad_steps = self.grad_states.unbind(0)


def _recompute_chunk(
    buf: _ChunkBuffers, steps: int, delta_c: Tensor, delta_u_c: Tensor, B_c: Tensor, A_T: Tensor, h_start: Tensor
) -> None:
    """Fill buf.decay[:steps] and buf.states[:steps+1] for one chunk starting from h_start.
    delta_c, delta_u_c: (T, batch, groups, 1, group_width); B_c: (T, batch, groups, d_state, 1);
    A_T: (groups, d_state, group_width)."""
    decay, states = buf.decay[:steps], buf.states[1 : steps + 1]
    buf.states[0].copy_(h_start)  # first: h_start may alias the buffer's last state
    torch.mul(delta_c, A_T, out=decay).exp_()
    torch.mul(delta_u_c, B_c, out=states)  # delta*u*B
    decay_steps, state_steps = buf.decay_steps, buf.state_steps
    for t in range(steps):  # h_t = exp(delta_t A) h_{t-1} + delta_t u_t B_t, in place
        state_steps[t + 1].addcmul_(decay_steps[t], state_steps[t])


def _rows(x: Tensor) -> Tensor:
    """(T, batch, groups, ...) -> (T*batch*groups, ...), for bmm."""
    return x.reshape(x.shape[0] * x.shape[1] * x.shape[2], *x.shape[3:])


def _per_group(x: Tensor, groups: int) -> Tensor:
    """(T, batch, d_inner) -> (T, batch, groups, 1, group_width) view."""
    return x.view(*x.shape[:2], groups, 1, -1)


def _A_T(A: Tensor, groups: int, dtype: torch.dtype) -> Tensor:
    """A (d_inner, d_state) -> (groups, d_state, group_width), contiguous."""
    return A.to(dtype).view(groups, -1, A.shape[1]).transpose(1, 2).contiguous()


def _forward_chunks(
    T: int, delta_t: Tensor, delta_u: Tensor, B_t: Tensor, C_t: Tensor, A_T: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The recurrence forward, T steps a chunk: (y = sum_n h C, time-major; the state before each
    chunk; the last state). delta_t, delta_u: (L, batch, d_inner); B_t, C_t: (L, batch, groups,
    d_state); A_T: (groups, d_state, group_width)."""
    length, batch, d_inner = delta_t.shape
    groups, d_state, width = A_T.shape
    n_chunks = (length + T - 1) // T
    buf = _ChunkBuffers(min(T, length), batch, groups, d_state, width, delta_t, with_grad=False)
    chunk_starts = delta_t.new_empty(n_chunks, batch, groups, d_state, width)  # h before each chunk
    y = _new_time_major(length, batch, d_inner, like=delta_t)  # sum_n h C (+ D u in the caller)
    h = delta_t.new_zeros(batch, groups, d_state, width)
    for c in range(n_chunks):
        t0, t1 = c * T, min(length, (c + 1) * T)
        chunk_starts[c].copy_(h)
        _recompute_chunk(
            buf,
            t1 - t0,
            _per_group(delta_t[t0:t1], groups),
            _per_group(delta_u[t0:t1], groups),
            B_t[t0:t1].unsqueeze(-1),
            A_T,
            chunk_starts[c],
        )
        states = buf.states[1 : t1 - t0 + 1]
        y[t0:t1] = torch.bmm(_rows(C_t[t0:t1]).unsqueeze(1), _rows(states)).view(t1 - t0, batch, d_inner)
        h = buf.states[t1 - t0]
    return y, chunk_starts, h


# ---- the backward pass, chunk by chunk (latest chunk first) ---------------------------------------


@dataclass
class _TimeMajorInputs:
    """The scan's inputs as the backward reads them: (L, batch, ...) in the compute dtype."""

    u: Tensor  # (L, batch, d_inner)
    delta: Tensor  # delta after bias and softplus, (L, batch, d_inner)
    delta_u: Tensor  # delta * u
    B: Tensor  # (L, batch, groups, d_state)
    C: Tensor
    A_T: Tensor  # (groups, d_state, group_width)


@dataclass
class _Gradients:
    """The gradients the backward fills chunk by chunk, time-major like the inputs."""

    u: Tensor  # (L, batch, d_inner); starts as the skip's D dy
    delta: Tensor  # of delta after bias and softplus
    B: Tensor  # (L, batch, groups, d_state)
    C: Tensor
    A_T: Tensor  # (groups, d_state, group_width), summed over the chunks

    @staticmethod
    def empty(scan: _TimeMajorInputs) -> _Gradients:
        length, batch, groups, d_state = scan.B.shape
        d_inner = scan.u.shape[2]
        return _Gradients(
            _new_time_major(length, batch, d_inner, like=scan.u),
            _new_time_major(length, batch, d_inner, like=scan.u),
            _new_time_major(length, batch, groups, d_state, like=scan.u),
            _new_time_major(length, batch, groups, d_state, like=scan.u),
            torch.zeros_like(scan.A_T),
        )


def _gate_backward(
    grad_out_t: Tensor, y: Tensor, z: Tensor | None, cdtype: torch.dtype
) -> tuple[Tensor, Tensor | None]:
    """The output gate out = y * silu(z): the gradients of y and of z (time-major; none without z)."""
    if z is None:
        return grad_out_t, None
    z_t = _time_major(z, cdtype)
    return grad_out_t * F.silu(z_t), torch.ops.aten.silu_backward(grad_out_t * y, z_t)


def _skip_backward(grad_y: Tensor, u_t: Tensor, D: Tensor | None, cdtype: torch.dtype, out: Tensor) -> Tensor | None:
    """The skip y += D u: writes its part of du (D dy, or zero without D) to `out`; returns dD."""
    if D is None:
        out.zero_()
        return None
    torch.mul(grad_y, D.to(cdtype), out=out)
    return (grad_y * u_t).sum((0, 1))


def _chunk_backward(
    buf: _ChunkBuffers,
    scan: _TimeMajorInputs,
    t0: int,
    t1: int,
    h_start: Tensor,
    grad_y: Tensor,
    grads: _Gradients,
    carry: Tensor,
) -> None:
    """Add the part of steps [t0, t1) to the gradients. `carry` comes in as exp(delta_t1 A) dL/dh_t1
    (from the chunk after) and leaves as exp(delta_t0 A) dL/dh_t0 (for the chunk before)."""
    steps = t1 - t0
    _, batch, groups, d_state = scan.B.shape
    delta_c = _per_group(scan.delta[t0:t1], groups)  # (T, batch, groups, 1, width)
    delta_u_c = _per_group(scan.delta_u[t0:t1], groups)
    B_c, C_c = scan.B[t0:t1], scan.C[t0:t1]  # (T, batch, groups, d_state)
    grad_y_c = _per_group(grad_y[t0:t1], groups)
    _recompute_chunk(buf, steps, delta_c, delta_u_c, B_c.unsqueeze(-1), scan.A_T, h_start)

    # y_t = C_t . h_t  ->  dC_t = h_t dy_t  (sum over the group's channels)
    states = _rows(buf.states[1 : steps + 1])
    grads.C[t0:t1] = torch.bmm(states, _rows(grad_y_c).transpose(1, 2)).view(steps, batch, groups, d_state)

    grad_h = _state_gradients(buf, steps, grad_y_c, C_c, carry)
    # before the decay's gradient overwrites h_{t-1} and the decays themselves
    torch.mul(buf.decay[0], grad_h[0], out=carry)
    grad_delta_c = _per_group(grads.delta[t0:t1], groups).squeeze(3)  # (T, batch, groups, width)
    _decay_backward(buf, steps, grad_h, delta_c, scan.A_T, grad_delta_c, grads.A_T)

    # Input b_t = delta_t u_t B_t.
    grad_h_rows = _rows(grad_h)
    grads.B[t0:t1] = torch.bmm(grad_h_rows, _rows(delta_u_c).transpose(1, 2)).view(steps, batch, groups, d_state)
    grad_b_dot_B = torch.bmm(_rows(B_c).unsqueeze(1), grad_h_rows).view(steps, batch, -1)
    grads.u[t0:t1].addcmul_(grad_b_dot_B, scan.delta[t0:t1])
    grads.delta[t0:t1].addcmul_(grad_b_dot_B, scan.u[t0:t1])


def _state_gradients(buf: _ChunkBuffers, steps: int, grad_y_c: Tensor, C_c: Tensor, carry: Tensor) -> Tensor:
    """The reverse-time recurrence G_t = dy_t C_t + exp(delta_{t+1} A) G_{t+1} over one chunk, in
    buf.grad_states[:steps], with `carry` as the last step's G_{t+1} term."""
    grad_h = buf.grad_states[:steps]
    torch.mul(grad_y_c, C_c.unsqueeze(-1), out=grad_h)
    grad_h[steps - 1].add_(carry)
    decay_steps, grad_steps = buf.decay_steps, buf.grad_steps
    for t in range(steps - 2, -1, -1):
        grad_steps[t].addcmul_(decay_steps[t + 1], grad_steps[t + 1])
    return grad_h


def _decay_backward(
    buf: _ChunkBuffers, steps: int, grad_h: Tensor, delta_c: Tensor, A_T: Tensor, grad_delta_c: Tensor, grad_A_T: Tensor
) -> None:
    """Decay a_t = exp(delta_t A): dL/d(delta_t A) = G_t * h_{t-1} * a_t, written to grad_delta_c
    (over d_state, times A) and added to grad_A_T (times delta). Spends buf's h_{t-1} and decays."""
    decay = buf.decay[:steps]
    grad_log_decay = buf.states[:steps].mul_(decay).mul_(grad_h)  # overwrites h_{t-1}
    torch.mul(grad_log_decay[:, :, :, 0], A_T[:, 0], out=grad_delta_c)
    for n in range(1, A_T.shape[1]):
        grad_delta_c.addcmul_(grad_log_decay[:, :, :, n], A_T[:, n])
    scratch = torch.mul(grad_log_decay, delta_c, out=decay)  # decay is spent
    grad_A_T.add_(scratch.sum((0, 1)))


def _user(x: Tensor, dtype: torch.dtype) -> Tensor:
    return _to_user_layout(x).to(dtype)


def _user_BC(x: Tensor, like: Tensor) -> Tensor:
    """(L, batch, groups, d_state) -> B's or C's shape (the group axis only where it had one)."""
    x = _user(x, like.dtype)
    return x.squeeze(1) if like.dim() == 3 else x


class SelectiveScanCPU(torch.autograd.Function):
    """The fused scan; see the module docstring. Use `selective_scan_cpu`."""

    @staticmethod
    def forward(
        ctx,
        u: Tensor,
        delta: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None,
        z: Tensor | None,
        delta_bias: Tensor | None,
        delta_softplus: bool,
        return_last_state: bool,
        chunk_len: int | None,
    ):
        dtype_in = u.dtype
        cdtype = compute_dtype(dtype_in)
        batch, d_inner, length = u.shape
        groups, d_state = grouped_bc(B).shape[1:3]
        A_T = _A_T(A, groups, cdtype)
        u_t = _time_major(u, cdtype)
        B_t, C_t = _time_major(grouped_bc(B), cdtype), _time_major(grouped_bc(C), cdtype)  # (L, batch, groups, d_state)
        z_t = _time_major(z, cdtype) if z is not None else None
        delta_pre = _new_time_major(length, batch, d_inner, like=u_t)  # delta + bias
        if delta_bias is not None:
            torch.add(_time_major(delta, cdtype), delta_bias.to(cdtype), out=delta_pre)
        else:
            delta_pre.copy_(_time_major(delta, cdtype))
        delta_t = F.softplus(delta_pre) if delta_softplus else delta_pre
        delta_u = delta_t * u_t

        T = chunk_len or _default_chunk_len(batch, d_inner, d_state, length)
        y, chunk_starts, h = _forward_chunks(T, delta_t, delta_u, B_t, C_t, A_T)
        if D is not None:
            y.addcmul_(u_t, D.to(cdtype))
        out = y * F.silu(z_t) if z_t is not None else y

        ctx.save_for_backward(u, delta_pre, delta_t, A, B, C, D, z, delta_bias, chunk_starts, y)
        ctx.meta = (delta_softplus, T, cdtype, delta.dtype)
        out = _to_user_layout(out).to(dtype_in)
        if not return_last_state:
            return out
        last_state = h.transpose(2, 3).reshape(batch, d_inner, d_state)  # (batch, d_inner, d_state)
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
        groups, d_state = grouped_bc(B).shape[1:3]
        u_t = _time_major(u, cdtype)
        scan = _TimeMajorInputs(
            u_t,
            delta_t,
            delta_t * u_t,
            _time_major(grouped_bc(B), cdtype),
            _time_major(grouped_bc(C), cdtype),
            _A_T(A, groups, cdtype),
        )
        grad_y, grad_z_t = _gate_backward(_time_major(grad_out, cdtype), y, z, cdtype)
        grads = _Gradients.empty(scan)
        grad_D = _skip_backward(grad_y, u_t, D, cdtype, out=grads.u)

        buf = _ChunkBuffers(min(T, length), batch, groups, d_state, d_inner // groups, u_t, with_grad=True)
        # exp(delta_{t+1} A) * dL/dh_{t+1}, flowing into the last step of the chunk before.
        carry = u_t.new_zeros(batch, groups, d_state, d_inner // groups)
        for c in reversed(range(chunk_starts.shape[0])):
            _chunk_backward(buf, scan, c * T, min(length, (c + 1) * T), chunk_starts[c], grad_y, grads, carry)

        grad_delta_t = grads.delta
        if delta_softplus:
            grad_delta_t = torch.ops.aten.softplus_backward(grad_delta_t, delta_pre, 1.0, 20.0)
        grad_bias = grad_delta_t.sum((0, 1)) if delta_bias is not None else None
        return (
            _user(grads.u, u.dtype),
            _user(grad_delta_t, delta_dtype),
            grads.A_T.transpose(1, 2).reshape(d_inner, d_state).to(A.dtype),
            _user_BC(grads.B, B),
            _user_BC(grads.C, C),
            grad_D.to(D.dtype) if grad_D is not None else None,
            _user(grad_z_t, z.dtype) if z is not None else None,
            grad_bias.to(delta_bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
        )


def _check_groups(name: str, u: Tensor, A: Tensor, B: Tensor, C: Tensor) -> None:
    if A.is_complex() or B.dim() not in (3, 4) or C.dim() != B.dim():
        raise NotImplementedError(
            f"{name}: real A and B, C of shape (batch, d_state, L) or (batch, groups, d_state, L) only"
        )
    if B.dim() == 4 and (u.shape[1] % B.shape[1] or B.shape[1] != C.shape[1]):
        raise ValueError(
            f"{name}: {u.shape[1]} channels do not split into the {B.shape[1]} groups of B and the {C.shape[1]} of C"
        )


def selective_scan_cpu(
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
    chunk_len: int | None = None,
):
    """The fused CPU scan (works on any device, but is meant for the CPU).

    Same arguments and result as mamba-ssm's `selective_scan_fn` (real A; B and C of
    shape (batch, d_state, L) or grouped (batch, groups, d_state, L)). With
    `return_last_state` it returns (out, h_L); like mamba-ssm, no gradient flows through
    h_L. `chunk_len` overrides the chunk length.
    """
    _check_groups("selective_scan_cpu", u, A, B, C)
    # The scan is computed in float32 (float64) whatever autocast says (its bmm would run in
    # bf16); the backward disables autocast itself.
    with torch.autocast(device_type=u.device.type, enabled=False):
        return SelectiveScanCPU.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, chunk_len)
