"""The Hyena-family layers beyond the primitive contract (tests/test_contract.py): float32
step mode at the MAD width, the long-convolution kernels, causality, sparse routing, training."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)

from layer_helpers import make, run_steps  # noqa: E402

from madsl.kernels.fftconv import (  # noqa: E402
    causal_conv,
    direct_causal_conv,
    fft_causal_conv,
    short_causal_conv,
    toeplitz_causal_conv,
)
from madsl.layers.implicit_filters import HyenaFilter  # noqa: E402
from madsl.layers.modal_filters import ModalFilter  # noqa: E402

CONV_METHODS = ("fft", "toeplitz")


# ---- parameter parity --------------------------------------------------------------------------------


# ---- state sizes -------------------------------------------------------------------------------------


# ---- step mode == parallel form ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["hyena", "multihead_hyena", "hyena_experts"])
@pytest.mark.parametrize("method", CONV_METHODS)
def test_step_matches_forward_float32_defaults(name, method):
    torch.manual_seed(1)
    _, module = make(name, 128)
    module.conv_method = method
    x = torch.randn(2, 12, 128)
    stepped, _ = run_steps(module, x)
    parallel = module(x)
    torch.testing.assert_close(stepped, parallel, atol=2e-5 * parallel.abs().max().item() + 1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("hyena", {}),
        ("multihead_hyena", {"heads": 4}),
        ("hyena_experts", {"experts": 4, "expert_width": 8}),
    ],
)
def test_bf16_autocast_keeps_the_long_convolution_in_float32(name, overrides):
    torch.manual_seed(0)
    _, module = make(name, 32, **overrides)
    x = torch.randn(2, 40, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(x)
        taps = module.long_filter(40)
    assert taps.dtype == torch.float32
    reference = module(x)
    assert (y.float() - reference).abs().max() < 0.05 * reference.abs().max()


# ---- kernels -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [1, 7, 64, 200])
def test_fft_and_toeplitz_match_direct_convolution(seq_len):
    torch.manual_seed(0)
    u = torch.randn(3, 5, seq_len, dtype=torch.float64)
    h = torch.randn(5, seq_len + 3, dtype=torch.float64)  # longer filters are cut to L
    skip = torch.randn(5, dtype=torch.float64)
    reference = direct_causal_conv(u, h, skip)
    # the definition, written out for one channel
    t = seq_len - 1
    assert torch.allclose(reference[1, 2, t], (h[2, : t + 1].flip(0) * u[1, 2, : t + 1]).sum() + skip[2] * u[1, 2, t])
    for conv in (fft_causal_conv, toeplitz_causal_conv):
        torch.testing.assert_close(conv(u, h, skip), reference, atol=1e-10, rtol=0)
    # broadcast filter (one per head, shared by the head's outer-product channels), float32
    u4 = torch.randn(2, 3, 4, 4, seq_len)
    h4 = torch.randn(3, 1, 1, seq_len)
    reference4 = direct_causal_conv(u4.double(), h4.double())
    for method in ("fft", "toeplitz", "auto"):
        out = causal_conv(u4, h4, method=method)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.double(), reference4, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("taps", [1, 3, 4])
def test_short_conv_matches_a_causal_conv1d(taps):
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(6, 6, taps, groups=6, padding=taps - 1).double()
    z = torch.randn(2, 11, 6, dtype=torch.float64)  # (B, L, C), as in_proj leaves it
    expected = conv(z.transpose(1, 2))[..., :11]
    torch.testing.assert_close(short_causal_conv(z, conv.weight, conv.bias), expected)
    torch.testing.assert_close(short_causal_conv(z, conv.weight, None), expected - conv.bias[:, None])


def test_fft_conv_computes_half_precision_in_float32():
    u = torch.randn(2, 4, 50)
    h = torch.randn(4, 50)
    out = fft_causal_conv(u.bfloat16(), h)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), direct_causal_conv(u.bfloat16().float(), h), atol=0.1, rtol=0.02)


def test_fft_conv_gradients():
    u = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    h = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    skip = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fft_causal_conv, (u, h, skip))
    assert torch.autograd.gradcheck(toeplitz_causal_conv, (u, h, skip))


# ---- filters -----------------------------------------------------------------------------------------


def test_modal_filter_is_stable_and_matches_its_recurrence():
    torch.manual_seed(0)
    modal = ModalFilter(6, 4).double()
    with torch.no_grad():
        modal.log_rate.uniform_(-8, 3)  # any value of the parameter is a stable pole
    assert (torch.exp(modal.log_poles()).abs() < 1).all()
    taps = modal(30)
    # impulse response of the recurrence x_t = lambda x_{t-1} + u_t, y_t = Re(sum R x_t)
    state = modal.init_state(1, dtype=torch.float64)
    response = []
    for t in range(30):
        y, state = modal.step(torch.full((1, 6), float(t == 0), dtype=torch.float64), state)
        response.append(y[0])
    torch.testing.assert_close(torch.stack(response, dim=-1), taps, atol=1e-12, rtol=0)


@pytest.mark.parametrize("seq_len", [1, 2, 50, 1000])
def test_modal_filter_matches_its_definition(seq_len):
    torch.manual_seed(0)
    modal = ModalFilter(5, 3).double()
    with torch.no_grad():
        modal.log_rate.uniform_(-7, 0)
    t = torch.arange(seq_len, dtype=torch.float64)
    expected = (modal.residues()[..., None] * torch.exp(modal.log_poles()[..., None] * t)).real.sum(1)
    torch.testing.assert_close(modal(seq_len), expected, atol=1e-12, rtol=0)


def test_modal_filter_init_spans_time_scales():
    torch.manual_seed(0)
    modal = ModalFilter(128, 16)
    time_constants = 1 / torch.exp(modal.log_rate)
    assert time_constants.min() < 40 and time_constants.max() > 1000


def test_hyena_filter_taps_do_not_depend_on_length():
    torch.manual_seed(0)
    implicit = HyenaFilter(8, 16, 3)
    short, long = implicit(10), implicit(300)
    assert short.shape == (8, 10) and long.shape == (8, 300)
    torch.testing.assert_close(short, long[:, :10])
    # the decay window: the fastest channel has decayed more than the slowest one
    assert long[-1, 250:].abs().max() < long[0, 250:].abs().max()


# ---- causality ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", CONV_METHODS)
@pytest.mark.parametrize(
    "name,overrides",
    [
        ("hyena", {"order": 3}),
        ("hyena", {"filter": "hyena"}),
        ("multihead_hyena", {"heads": 4}),
        ("multihead_hyena", {"heads": 4, "filter": "hyena"}),
        ("hyena_experts", {"experts": 4, "expert_width": 8}),
    ],
)
def test_future_tokens_do_not_change_past_outputs(name, overrides, method):
    torch.manual_seed(0)
    _, module = make(name, 32, **overrides)
    module = module.double()
    module.conv_method = method
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    changed = x.clone()
    changed[:, 25:] = 100 * torch.randn(2, 15, 32, dtype=torch.float64)
    y, y_changed = module(x), module(changed)
    torch.testing.assert_close(y[:, :25], y_changed[:, :25], atol=1e-9, rtol=0)
    assert not torch.allclose(y[:, 25:], y_changed[:, 25:])


# ---- routing -----------------------------------------------------------------------------------------


def test_router_gives_exactly_zero_weight_to_unselected_experts():
    torch.manual_seed(0)
    _, module = make("hyena_experts", 32, experts=4, expert_width=8, active=2)
    x = torch.randn(3, 20, 32)
    weights = module.routing_weights(x)
    assert ((weights > 0).sum(-1) == 2).all() and ((weights == 0).sum(-1) == 2).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 20))
    top = module.router(x).topk(2, dim=-1)
    torch.testing.assert_close(weights.gather(-1, top.indices), torch.softmax(top.values, -1))

    # changing everything that feeds expert e leaves the tokens that did not select e unchanged
    expert = 1
    unselected = weights[..., expert] == 0
    assert unselected.any() and (~unselected).any()
    y = module(x)
    channels = torch.arange(expert * 8, (expert + 1) * 8)
    with torch.no_grad():
        for part in range(3):  # x_0, x_1, v rows of in_proj
            module.in_proj.weight[part * 32 + channels] += torch.randn(8, 32)
    y_changed = module(x)
    torch.testing.assert_close(y[unselected], y_changed[unselected])
    assert not torch.allclose(y[~unselected], y_changed[~unselected])


# ---- training ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,overrides",
    [
        ("hyena", {}),
        ("hyena", {"filter": "hyena"}),
        ("multihead_hyena", {"heads": 4}),
        ("hyena_experts", {"experts": 4, "expert_width": 8}),
    ],
)
def test_a_few_training_steps_reduce_the_loss(name, overrides):
    torch.manual_seed(0)
    _, module = make(name, 32, **overrides)
    x = torch.randn(8, 32, 32)
    target = torch.randn(8, 32, 32).cumsum(1) / 8  # depends on the past: needs the long convolution
    optimizer = torch.optim.Adam(module.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = torch.nn.functional.mse_loss(module(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
