"""The chunked forms of the linear recurrences against the published recurrences, written out
token by token in float64 here (independently of the kernels' own step functions)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels.linear_recurrence import decay_chunked, delta_chunked

B, H, L, K, V = 2, 3, 29, 5, 4


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rand(B, H, L, K), F.normalize(rand(B, H, L, K), dim=-1), rand(B, H, L, V)
    log_decay = -3 * torch.rand(B, H, L, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, L, generator=g, dtype=torch.float64)
    return q, k, v, log_decay, beta, rand(B, H, K, V)


def _gated_delta_rule(q, k, v, beta, log_decay, state):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t (Yang et al. 2024, eq. 10)."""
    eye = torch.eye(K, dtype=q.dtype)
    outputs = []
    for t in range(L):
        kt, vt, qt = k[:, :, t, :, None], v[:, :, t, :, None], q[:, :, t, :, None]
        alpha = log_decay[:, :, t, None, None].exp()
        b = beta[:, :, t, None, None]
        state = alpha * (eye - b * kt @ kt.transpose(-1, -2)) @ state + b * kt @ vt.transpose(-1, -2)
        outputs.append((state.transpose(-1, -2) @ qt)[..., 0])
    return torch.stack(outputs, 2), state


def _decayed_linear_attention(q, k, v, log_decay, state):
    """S_t = alpha_t S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (retention / SSD / linear attention)."""
    outputs = []
    for t in range(L):
        state = log_decay[:, :, t, None, None].exp() * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        outputs.append((q[:, :, t, None, :] @ state)[..., 0, :])
    return torch.stack(outputs, 2), state


@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("carried", [True, False])
def test_delta_rule_chunk_form_equals_the_recurrence(chunk, gated, carried):
    q, k, v, log_decay, beta, s0 = _inputs()
    log_decay = log_decay if gated else torch.zeros_like(log_decay)
    s0 = s0 if carried else torch.zeros_like(s0)
    expected, final = _gated_delta_rule(q, k, v, beta, log_decay, s0)
    out, state = delta_chunked(q, k, v, beta, log_decay if gated else None, s0 if carried else None, chunk)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk", [1, 8, 64])
@pytest.mark.parametrize("carried", [True, False])
def test_decayed_chunk_form_equals_the_recurrence(chunk, carried):
    q, k, v, log_decay, _, s0 = _inputs(1)
    s0 = s0 if carried else torch.zeros_like(s0)
    expected, final = _decayed_linear_attention(q, k, v, log_decay, s0)
    out, state = decay_chunked(q, k, v, log_decay, s0 if carried else None, chunk)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(state, final, rtol=1e-10, atol=1e-10)


def test_extreme_decays_stay_finite_in_float32():
    """A decay of e^-100 per token (gate logits far out) underflows to zero, never to inf or nan."""
    q, k, v, log_decay, beta, _ = (t.float() for t in _inputs(2))
    for out, _ in (decay_chunked(q, k, v, log_decay * 100), delta_chunked(q, k, v, beta, log_decay * 100)):
        assert torch.isfinite(out).all()


def test_mamba2_layer_is_the_ssd_recurrence_of_its_weights():
    """Mamba-2 written out from the module's own weights, one token at a time (Dao & Gu 2024, §3):
    h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = h_t^T C_t + D x_t, then the gated norm."""
    from madsl.lang.stdlib import primitive

    torch.manual_seed(0)
    p = primitive("mamba2", 16, d_state=6, head_dim=8, groups=2)
    m = p.build().double()
    u = torch.randn(2, 9, 16, dtype=torch.float64)
    E, N, H, G = p.d_inner, p.d_state, p.n_heads, p.groups
    z, xBC, dt = m.in_proj(u).split((E, E + 2 * G * N, H), dim=-1)
    xBC = F.silu(
        F.conv1d(
            F.pad(xBC.transpose(1, 2), (p.d_conv - 1, 0)), m.conv.conv.weight, m.conv.conv.bias, groups=xBC.shape[-1]
        )
    ).transpose(1, 2)
    x, Bm, Cm = xBC.split((E, G * N, G * N), dim=-1)
    dt = F.softplus(dt + m.dt_bias)
    A = -m.A_log.exp()
    h = torch.zeros(2, H, p.head_dim, N, dtype=torch.float64)
    ys = []
    for t in range(9):
        xt = x[:, t].view(2, H, p.head_dim)
        group = torch.arange(H) // (H // G)
        Bt, Ct = Bm[:, t].view(2, G, N)[:, group], Cm[:, t].view(2, G, N)[:, group]
        h = (dt[:, t] * A).exp()[..., None, None] * h + dt[:, t, :, None, None] * xt[..., None] * Bt[:, :, None]
        ys.append((h @ Ct[..., None])[..., 0] + m.D[:, None] * xt)
    y = torch.stack(ys, 1).flatten(-2) * F.silu(z)
    y = y.unflatten(-1, (G, -1))
    y = (y * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-5)).flatten(-2) * m.norm_weight
    torch.testing.assert_close(m(u), m.out_proj(y), rtol=1e-10, atol=1e-10)


def test_mlstm_parallel_form_is_the_unstabilised_recurrence():
    """xLSTM eqs. 19-24 without the stabiliser (exact in float64 at moderate gates):
    C_t = f_t C_{t-1} + i_t k_t v_t^T, n_t = f_t n_{t-1} + i_t k_t, h_t = C_t^T q_t / max(|n_t . q_t|, 1)."""
    from madsl.layers.mlstm import mlstm_parallel

    q, k, v, log_decay, _, _ = _inputs(3)
    g = torch.Generator().manual_seed(4)
    log_input = torch.randn(B, H, L, generator=g, dtype=torch.float64)
    C, n = torch.zeros(B, H, K, V, dtype=torch.float64), torch.zeros(B, H, K, dtype=torch.float64)
    outputs = []
    for t in range(L):
        f, i = log_decay[:, :, t].exp()[..., None], log_input[:, :, t].exp()[..., None]
        C = f[..., None] * C + i[..., None] * k[:, :, t, :, None] * v[:, :, t, None, :]
        n = f * n + i * k[:, :, t]
        num = (q[:, :, t, None, :] @ C)[..., 0, :]
        den = (n * q[:, :, t]).sum(-1, keepdim=True).abs().clamp(min=1.0)
        outputs.append(num / den)
    h, _ = mlstm_parallel(q, k, v, log_input, log_decay)
    torch.testing.assert_close(h, torch.stack(outputs, 2), rtol=1e-10, atol=1e-10)


def test_rwkv_time_mixer_is_the_wkv_recurrence():
    """RWKV-5/6's WKV (Peng et al. 2024): o_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T), S_t = diag(w_t) S_{t-1}
    + k_t v_t^T, written out here from the layer's own projections; the layer's parallel form must match."""
    from madsl.lang.stdlib import primitive

    for version in (5, 6):
        torch.manual_seed(0)
        p = primitive("rwkv", 32, version=version, head_dim=8, mix_rank=4, decay_rank=8)
        m = p.build().double()
        with torch.no_grad():
            for w in m.parameters():
                w.add_(0.1 * torch.randn_like(w))
        x = torch.randn(2, 9, 32, dtype=torch.float64)
        previous = F.pad(x, (0, 0, 1, -1))
        r, k, v, log_w, gate = m._inputs(x, previous)
        u = m.bonus.view(p.heads, p.head_dim)
        S = torch.zeros(2, p.heads, p.head_dim, p.head_dim, dtype=torch.float64)
        outputs = []
        for t in range(9):
            kv = k[:, t, :, :, None] * v[:, t, :, None, :]
            outputs.append((r[:, t, :, None, :] @ (S + u[..., None] * kv))[..., 0, :])
            S = log_w[:, t].exp()[..., None] * S + kv
        expected = m._readout(torch.stack(outputs, 1), gate)
        torch.testing.assert_close(m(x), expected, rtol=1e-10, atol=1e-10)
