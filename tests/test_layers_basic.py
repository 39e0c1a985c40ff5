"""Attention, gated linear attention, SwiGLU and MoE beyond the primitive contract
(tests/test_contract.py: parameters, state, step == forward): causality, chunked GLA ==
recurrent GLA, MoE routing, and that training learns what needs the layer. Tiny sizes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from madsl.kernels.gla import _largest_safe_chunk, gla_chunked, gla_recurrent
from madsl.lang import stdlib
from madsl.layers.gla import GatedLinearAttention

torch.set_num_threads(1)


def build(symbol: str, dim: int = 32, **overrides):
    """(accounting primitive, torch module) of a stdlib symbol with some defaults overridden."""
    sym = stdlib.symbols()[symbol]
    entry = stdlib.primitives()[sym.primitive]
    prim = entry.cls.create(dim, {**entry.defaults, **sym.params, **overrides})
    return prim, prim.build()


# ---- parameter parity ---------------------------------------------------------------------------


def test_rotary_has_no_parameters_or_saved_buffers():
    _, with_rotary = build("mA", rotary=True)
    _, without = build("mA", rotary=False)
    with_rotary(torch.randn(1, 5, 32))
    assert with_rotary.state_dict().keys() == without.state_dict().keys()


# ---- causality ----------------------------------------------------------------------------------


@pytest.mark.parametrize("symbol", ["A", "mA", "Alg", "mAlg"])
def test_causal(symbol):
    torch.manual_seed(0)
    _, layer = build(symbol)
    layer.double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    t = 17
    x2 = x.clone()
    x2[:, t + 1] += torch.randn(2, 32, dtype=torch.float64)
    y, y2 = layer(x), layer(x2)
    # Up to rounding: the chunked GLA kernel factors its decays around a reference point
    # taken over the whole chunk, so future tokens of the same chunk touch the last bits.
    torch.testing.assert_close(y2[:, : t + 1], y[:, : t + 1], rtol=1e-13, atol=1e-13)
    assert (y2[:, t + 1] - y[:, t + 1]).abs().max() > 1e-3


# ---- step == forward ----------------------------------------------------------------------------


# ---- chunked GLA == recurrent GLA ---------------------------------------------------------------


@pytest.mark.parametrize("length,chunk", [(64, 16), (100, 32), (7, 64), (129, 64)])
@pytest.mark.parametrize("gate_scale", [1.0, 1000.0])  # 1000: decays of e^-250 per step on average
def test_chunked_matches_recurrent(length, chunk, gate_scale):
    torch.manual_seed(length)
    batch, heads, key_dim, value_dim = 2, 3, 8, 5
    shapes = [(batch, heads, length, d) for d in (key_dim, key_dim, value_dim, key_dim)]
    inputs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    initial = torch.randn(batch, heads, key_dim, value_dim, dtype=torch.float64)
    weights = torch.randn(batch, heads, length, value_dim, dtype=torch.float64)

    def run(kernel, **kw):
        q, k, v, gate_logits = inputs
        log_decay = F.logsigmoid(gate_scale * gate_logits) / 4
        o, final = kernel(q, k, v, log_decay, initial, **kw)
        loss = (o * weights).sum() + final.square().sum()
        return (o, final, *torch.autograd.grad(loss, inputs))

    expected = run(gla_recurrent)
    got = run(gla_chunked, chunk_size=chunk)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("gate_scale", [1.0, 40.0])
def test_chunked_float32_and_no_initial_state(gate_scale):
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 150, d) for d in (16, 16, 16))
    log_decay = F.logsigmoid(gate_scale * torch.randn(2, 2, 150, 16)) / 16
    o_ref, s_ref = gla_recurrent(q, k, v, log_decay)
    o, s = gla_chunked(q, k, v, log_decay)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


def test_chunk_halves_only_for_extreme_gates():
    ordinary = F.logsigmoid(torch.randn(2, 2, 256, 16)) / 16  # what the layer produces at init
    assert _largest_safe_chunk(ordinary, 64) == 64
    extreme = torch.full((1, 1, 256, 4), -5.0)  # float32 holds e^-140 per chunk: 64 -> 16
    assert _largest_safe_chunk(extreme, 64) == 16
    assert _largest_safe_chunk(extreme.double(), 64) == 64


def test_gla_layer_kernels_agree():
    torch.manual_seed(0)
    _, layer = build("mAlg")
    layer.double()
    x = torch.randn(2, 45, 32, dtype=torch.float64)
    layer.kernel = "recurrent"
    y_ref = layer(x)
    layer.kernel = "chunked"
    layer.chunk_size = 16
    torch.testing.assert_close(layer(x), y_ref, rtol=1e-10, atol=1e-10)


# ---- MoE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dense", [True, False])
def test_moe_unselected_experts_have_no_effect(dense):
    torch.manual_seed(0)
    _, moe = build("MoE", experts=6, expert_width=8, active=2)
    moe.dense_dispatch = dense
    x = torch.randn(1, 2, 32)  # 2 tokens x 2 active: at least 2 of the 6 experts unused
    chosen = moe.router(x.reshape(-1, 32)).topk(2, dim=-1).indices
    unused = sorted(set(range(6)) - set(chosen.flatten().tolist()))
    y = moe(x)
    perturbed = copy.deepcopy(moe)
    perturbed.dense_dispatch = dense
    with torch.no_grad():  # (deepcopy after a forward: the MoE drops its aux_loss graph)
        for w in (perturbed.w_gate, perturbed.w_up, perturbed.w_down):
            w[unused] += 100.0
    assert torch.equal(perturbed(x), y)
    # Unselected experts get no gradient; the router gets one through the top-k softmax.
    y.square().sum().backward()
    assert torch.all(moe.w_down.grad[unused] == 0)
    assert moe.router.weight.grad.abs().sum() > 0


def test_moe_matches_sparse_definition_and_paths_agree():
    torch.manual_seed(1)
    _, moe = build("MoE", experts=5, expert_width=6, active=3)
    moe.double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    tokens = x.reshape(-1, 32)
    logits = moe.router(tokens)
    expected = torch.zeros_like(tokens)
    for i, token in enumerate(tokens):
        top = logits[i].topk(3)
        for weight, e in zip(top.values.softmax(-1), top.indices):
            hidden = F.silu(token @ moe.w_gate[e]) * (token @ moe.w_up[e])
            expected[i] += weight * (hidden @ moe.w_down[e])
    for dense in (True, False):
        moe.dense_dispatch = dense
        torch.testing.assert_close(moe(x).reshape(-1, 32), expected, rtol=1e-12, atol=1e-12)


def test_moe_aux_loss():
    torch.manual_seed(0)
    _, moe = build("MoE")
    assert moe.aux_loss is None
    moe(torch.randn(2, 9, 32))
    aux = moe.aux_loss
    assert aux.ndim == 0 and torch.isfinite(aux) and aux > 0
    aux.backward()
    assert moe.router.weight.grad.abs().sum() > 0  # it trains the router
    # A uniform router (P_e = 1/experts) gives exactly aux_loss_weight, whatever the dispatch.
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(torch.randn(3, 8, 32))
    assert moe.aux_loss.item() == pytest.approx(moe.aux_loss_weight, rel=1e-6)


# ---- training reduces a loss --------------------------------------------------------------------


@pytest.mark.parametrize("symbol", ["Sg", "MoE"])
def test_few_steps_reduce_loss(symbol):
    """Channel mixers fit a position-wise target. (Sequence mixers must learn what needs them:
    tests/test_compiler.py::test_training_learns_what_needs_the_sequence_mixer.)"""
    torch.manual_seed(0)
    _, layer = build(symbol, dim=16)
    x = torch.randn(4, 12, 16)
    target = torch.randn(4, 12, 16)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = F.mse_loss(layer(x), target)
        aux = getattr(layer, "aux_loss", None)
        total = loss + aux if aux is not None else loss
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


def test_moe_chooses_dense_at_mad_sizes():
    assert build("MoE", 128)[1].dense_dispatch
    assert not build("MoE", 128, expert_width=512)[1].dense_dispatch


def test_gla_state_is_float_state_of_right_shape():
    _, layer = build("mAlg", dim=128)
    state = layer.init_state(3)
    assert state["fixed"].shape == (3, 8, 16, 16)
    assert isinstance(layer, GatedLinearAttention)


def test_fla_wrapper_layout(monkeypatch):
    """The CUDA path's plumbing, on the CPU: a stand-in for fla's chunk_gla with fla's
    (batch, L, heads, dim) layout and signature must give the recurrence's result."""
    import madsl.kernels.gla as kernels

    def fake_chunk_gla(
        q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, head_first=True
    ):
        assert not head_first and scale == 1.0
        o, final = gla_recurrent(*(x.transpose(1, 2) for x in (q, k, v, g)), initial_state)
        return o.transpose(1, 2), final

    monkeypatch.setattr(kernels, "fla_chunk_gla", lambda: fake_chunk_gla)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, d, dtype=torch.float64) for d in (4, 4, 5))
    log_decay = F.logsigmoid(torch.randn(2, 3, 10, 4, dtype=torch.float64))
    o, final = kernels.gla_fla_chunk(q, k, v, log_decay)
    o_ref, final_ref = gla_recurrent(q, k, v, log_decay)
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(final, final_ref)


@pytest.mark.parametrize("version", [5, 6])
def test_rwkv_takes_flas_chunk_gla_where_it_applies(monkeypatch, version):
    """On CUDA with fla installed RWKV's WKV runs fla's chunk_gla (stable for any decays, no
    host reads: its stacked step can be a CUDA graph), on the token-shifted k, v and log w
    as madsl's chunked form does. On the CPU, through a stand-in with fla's layout and
    signature: forward and gradients equal the chunked form's, with decays strong enough that
    the chunked form halves its chunks."""
    import madsl.kernels.gla as kernels

    calls = []

    def fake_chunk_gla(
        q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None, head_first=True
    ):
        calls.append(q.shape)
        assert not head_first and scale == 1.0
        o, final = gla_recurrent(
            *(x.transpose(1, 2).double() for x in (q, k, v, g)),
            None if initial_state is None else initial_state.double(),
        )
        return o.transpose(1, 2).to(v.dtype), final.float()

    torch.manual_seed(0)
    layer = stdlib.primitive("rwkv", 64, version=version).build()
    with torch.no_grad():
        layer.time_decay.add_(3.0)  # log w = -exp(decay) down to about -20 a token: chunks halve
    x = torch.randn(2, 40, 64, requires_grad=True)
    from madsl.layers.rwkv import _previous

    with torch.no_grad():  # the point of the decays: the chunked form cannot take the sequence in one chunk
        log_w = layer._inputs(x, _previous(x))[3]
        assert _largest_safe_chunk(log_w.transpose(1, 2), 40) < 40

    def run():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y = layer(x)
        y.square().mean().backward()
        return [y, x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]

    want = run()  # madsl's chunked form on the CPU
    monkeypatch.setattr(kernels, "fla_applies", lambda t: t.dtype != torch.float64)
    monkeypatch.setattr(kernels, "fla_chunk_gla", lambda: fake_chunk_gla)
    got = run()
    assert len(calls) == 1  # one kernel call per forward
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-4)
