"""The long-convolution filter families of the Hyena operators (`H{filter=...}`), beyond the
primitive contract (tests/test_contract.py builds every family in every Hyena primitive):
parity through the compiler, the FFT path's step mode, causality, each family against its
definition, training."""

from __future__ import annotations

import glob
import math
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from layer_helpers import make, n_params, run_steps  # noqa: E402

import madsl  # noqa: E402
from madsl.lang.budget import check  # noqa: E402
from madsl.lang.stdlib import primitives  # noqa: E402
from madsl.layers.explicit_filters import Conv1dFilter, FNOFilter  # noqa: E402
from madsl.layers.filters import build_filter  # noqa: E402
from madsl.layers.implicit_filters import CKConvFilter  # noqa: E402
from madsl.layers.modal_filters import S4DFilter  # noqa: E402
from madsl.layers.rational_filter import RationalFilter  # noqa: E402
from madsl.primitives.base import ConfigError  # noqa: E402
from madsl.primitives.filters import FILTERS  # noqa: E402

# small settings that exercise every hyperparameter a family reads (fno: 5 modes of a
# 32-point spectrum, so a 40-step sequence outgrows the filter; rational: order 4)
SMALL = {
    "filter_states": 4,
    "filter_order": 8,
    "filter_emb_dim": 5,
    "filter_size": 6,
    "filter_modes": 5,
    "filter_length": 32,
    "filter_emb_learned": False,
}
SEQ_LEN = 24


def randomise(module: torch.nn.Module) -> None:
    """Move the rational filters off their all-zero init (b = 0 would make the checks trivial);
    moderate values keep the poles well inside the unit circle."""
    for filt in module.modules():
        if isinstance(filt, RationalFilter):
            with torch.no_grad():
                filt.reflection.uniform_(-0.6, 0.6)
                filt.numerator.normal_(0, 0.5)


def impulse_response(filt, steps: int) -> torch.Tensor:
    """The filter's step mode driven by a unit impulse on every channel: (channels, steps)."""
    state = filt.init_state(1, dtype=torch.float64)
    out = []
    for t in range(steps):
        y, state = filt.step(torch.full((1, filt.channels), float(t == 0), dtype=torch.float64), state)
        out.append(y[0])
    return torch.stack(out, dim=-1)


def test_every_family_is_a_choice_of_the_three_hyena_primitives():
    assert set(FILTERS) == {"conv1d", "fno", "s4d", "rational", "ckconv", "hyena", "modal"}
    for name in ("hyena", "multihead_hyena", "hyena_experts"):
        assert set(primitives()[name].cls.fields()["filter"].__args__) == set(FILTERS)


# ---- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FILTERS)
def test_compiled_model_matches_accounting(kind):
    spec = madsl.spec_from_topology(f"H{{filter={kind}}}", dim=64)
    model = madsl.compile(spec, vocab_size=10)
    assert n_params(model) == madsl.account(spec, vocab=10).totals["params"]


def test_defaults_at_width_64():
    """The table of docs/accounting.md ("Long-convolution filters"): one order-2 H at width 64."""
    expected = {  # kind: (filter params, fixed state, kv cache at L = 1024)
        "modal": (4 * 64 * 16, 64 * 16, 0),
        "s4d": (64 * (4 * 16 + 2), 64 * 16, 0),
        "rational": (64 * (2 * 16 + 1), 64 * 16, 0),
        "conv1d": (64 * 64, 64 * 63, 0),
        "fno": (2 * 64 * 64, 0, 64 * 1023),
        "ckconv": ((64 + 64) + 2 * (64 * 64 + 64) + 64 * 64 + 64, 0, 64 * 1024),
        "hyena": ((3 * 64 + 64) + 2 * (64 * 64 + 64) + 64 * 64 + 64 + 64, 0, 64 * 1024),
    }
    base, _ = make("hyena", 64, filter="conv1d", filter_size=1)  # everything but the filter (64 params)
    for kind, (filter_params, fixed, kv) in expected.items():
        entry = primitives()["hyena"]
        prim = entry.cls.create(64, {**entry.defaults, "filter": kind})
        assert prim.params() - (base.params() - 64) == filter_params, kind
        assert (prim.fixed_state(), prim.kv_cache(1024)) == (fixed, kv), kind


# ---- step mode == parallel form --------------------------------------------------------------------

STEP_LAYERS = [
    ("hyena", {}),
    ("hyena", {"order": 3}),
    ("multihead_hyena", {"heads": 4}),
    ("hyena_experts", {"experts": 3, "expert_width": 8}),
]


@pytest.mark.parametrize("kind", FILTERS)
def test_step_matches_forward_fft_path(kind):
    """The FFT long convolution (used beyond 128 tokens), past the filters' reference length."""
    torch.manual_seed(1)
    _, module = make("hyena", 16, filter=kind, **{**SMALL, "filter_length": 48})
    module = module.double()
    module.conv_method = "fft"
    randomise(module)
    x = torch.randn(1, 60, 16, dtype=torch.float64)  # past filter_length: fno ends, rational continues
    stepped, _ = run_steps(module, x)
    torch.testing.assert_close(stepped, module(x), atol=1e-8, rtol=0)


# ---- state sizes -----------------------------------------------------------------------------------


def test_fixed_state_of_each_family_at_width_64():
    for kind, per_channel in [
        ("modal", 16),
        ("s4d", 16),
        ("rational", 16),
        ("conv1d", 63),
        ("fno", 0),
        ("ckconv", 0),
        ("hyena", 0),
    ]:
        prim, module = make("hyena", 64, filter=kind)
        state = module.init_state(1)
        assert prim.fixed_state() == state["fixed"].numel() == 64 * per_channel


# ---- causality ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FILTERS)
@pytest.mark.parametrize("method", ["fft", "toeplitz"])
def test_future_tokens_do_not_change_past_outputs(kind, method):
    torch.manual_seed(0)
    _, module = make("hyena", 16, filter=kind, **SMALL)
    module = module.double()
    module.conv_method = method
    randomise(module)
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    changed = x.clone()
    changed[:, 20:] = 100 * torch.randn(2, 10, 16, dtype=torch.float64)
    y, y_changed = module(x), module(changed)
    torch.testing.assert_close(y[:, :20], y_changed[:, :20], atol=1e-9, rtol=0)
    assert not torch.allclose(y[:, 20:], y_changed[:, 20:])


# ---- each family against its definition ----------------------------------------------------------


@pytest.mark.parametrize("kind", FILTERS)
def test_taps_do_not_depend_on_the_length_asked_for(kind):
    torch.manual_seed(0)
    filt = build_filter(kind, 5, **{**SMALL, "filter_length": 64}).double()
    randomise(filt)
    torch.testing.assert_close(filt(10), filt(64)[:, :10])


@pytest.mark.parametrize("kind", FILTERS)
def test_impulse_response_of_the_step_mode_is_the_filter(kind):
    torch.manual_seed(0)
    filt = build_filter(kind, 3, **SMALL).double()
    randomise(filt)
    response = impulse_response(filt, 30)  # fno: past its 32 taps is checked by the layer tests
    expected = filt(30).clone()
    if filt.skip is not None:
        expected[:, 0] += filt.skip
    torch.testing.assert_close(response, expected, atol=1e-10, rtol=0)


def test_conv1d_taps_are_its_weights_then_zero():
    filt = Conv1dFilter(3, 5)
    taps = filt(9)
    torch.testing.assert_close(taps[:, :5], filt.weight)
    assert (taps[:, 5:] == 0).all()
    torch.testing.assert_close(filt(3), filt.weight[:, :3])


def test_fno_taps_are_the_band_limited_spectrum():
    torch.manual_seed(0)
    filt = FNOFilter(2, 3, 16).double()
    t = torch.arange(16, dtype=torch.float64)
    w = torch.complex(filt.weight_real, filt.weight_imag)
    # irfft: DC once (its imaginary part dropped), every other mode with its conjugate
    expected = w[:, :1].real + 2 * sum(
        (w[:, m : m + 1] * torch.exp(2j * math.pi * m * t / 16)).real for m in range(1, 3)
    )
    taps = filt(20)
    torch.testing.assert_close(taps[:, :16], expected / 16)
    assert (taps[:, 16:] == 0).all()
    # the frequency response at mode m is W_m (the DC one real), whatever the resolution
    response = torch.fft.rfft(filt(16))
    torch.testing.assert_close(response[:, 1:3], w[:, 1:])
    torch.testing.assert_close(response[:, 0], w[:, 0].real.to(response.dtype))
    assert (response[:, 3:].abs() < 1e-12).all()


def test_fno_rejects_more_modes_than_its_resolution_has():
    entry = primitives()["hyena"]
    with pytest.raises(ConfigError, match="filter_modes"):
        entry.cls.create(64, {**entry.defaults, "filter": "fno", "filter_modes": 20, "filter_length": 32})
    entry.cls.create(64, {**entry.defaults, "filter": "fno", "filter_modes": 17, "filter_length": 32})


def test_s4d_is_the_zoh_discretised_diagonal_ssm():
    torch.manual_seed(0)
    filt = S4DFilter(3, 4).double()
    dt = torch.exp(filt.log_dt)[:, None, None]
    a = torch.complex(-torch.exp(filt.log_a_real), filt.a_imag)[..., None]
    c = torch.complex(filt.c_real, filt.c_imag)[..., None]
    t = torch.arange(50, dtype=torch.float64)
    # S4D's kernel: K = 2 Re( C (exp(dt A) - 1) / A  exp(dt A t) ), summed over the modes
    expected = 2 * (c * (torch.exp(dt * a) - 1) / a * torch.exp(dt * a * t)).real.sum(1)
    torch.testing.assert_close(filt(50), expected, atol=1e-12, rtol=0)
    assert (torch.exp(dt * a).abs() < 1).all()


def test_rational_filter_is_b_over_a_with_stable_poles():
    torch.manual_seed(0)
    filt = RationalFilter(3, 5, 256).double()
    with torch.no_grad():
        filt.reflection.uniform_(-3, 3)  # any value: the poles stay inside the unit circle
        filt.numerator.normal_()
    a = filt.denominator().detach()
    assert torch.equal(a[:, 0], torch.ones(3, dtype=torch.float64))
    assert max(abs(np.roots(row.numpy())).max() for row in a) < 1  # z^n a(z) = z^n + a_1 z^(n-1) + ...
    # the taps are the power series of b/a: (a * h)[t] = b_t (up to the FFT's aliasing at 256 points,
    # negligible here because the poles are well inside the unit circle)
    with torch.no_grad():
        filt.reflection.uniform_(-0.5, 0.5)
    taps, a = filt(60), filt.denominator()
    convolved = torch.stack([sum(a[:, i] * taps[:, t - i] for i in range(min(t, 5) + 1)) for t in range(60)], -1)
    expected = torch.nn.functional.pad(filt.numerator, (1, 60 - 6))
    torch.testing.assert_close(convolved, expected, atol=1e-10, rtol=0)


def test_rational_filter_continues_past_its_truncation_length():
    """RTF's kernel is exact up to the truncation length M; past it, the taps follow the same
    recurrence (blocks with numerators b A^(jM)), so the step form agrees at any length."""
    torch.manual_seed(0)
    filt = RationalFilter(3, 4, 16).double()
    randomise(filt)
    expected = filt(70).clone()
    expected[:, 0] += filt.skip
    torch.testing.assert_close(impulse_response(filt, 70), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(filt(16), filt(70)[:, :16])
    entry = primitives()["hyena"]
    with pytest.raises(ConfigError, match="filter_length"):
        entry.cls.create(64, {**entry.defaults, "filter": "rational", "filter_states": 32, "filter_length": 32})


def test_ckconv_is_an_mlp_of_time_without_window():
    torch.manual_seed(0)
    filt = CKConvFilter(2, 8, 100)
    with torch.no_grad():  # the last layer's bias is a constant added to every tap
        filt.mlp_out.bias.fill_(5.0)
    taps = filt(300)
    assert taps.shape == (2, 300) and (taps[:, 200:].abs().mean() > 1)  # no decay window


def test_unknown_filter_names_the_families():
    entry = primitives()["hyena"]
    with pytest.raises(ConfigError, match="conv1d") as err:
        entry.cls.create(64, {**entry.defaults, "filter": "fn0"})
    assert err.value.hint == "did you mean 'fno'?"


def test_learned_positional_features_start_as_the_fixed_ones_and_extend_past_their_table():
    """filter_emb_learned (the MAD reference's PositionalEmbedding): the first filter_length
    features are parameters initialised to the fixed features, so at init the taps are those of
    the fixed filter at every length; past the table the fixed features continue, and step mode
    agrees with the parallel form across that boundary."""
    sizes = {**SMALL, "filter_length": 8}
    torch.manual_seed(0)
    fixed = build_filter("hyena", 3, **sizes).double()
    torch.manual_seed(0)
    learned = build_filter("hyena", 3, **{**sizes, "filter_emb_learned": True}).double()
    assert n_params(learned) - n_params(fixed) == 8 * SMALL["filter_emb_dim"]
    torch.testing.assert_close(learned(20), fixed(20), rtol=0, atol=1e-6)  # the table was made in float32
    with torch.no_grad():
        learned.features_table.add_(0.1 * torch.randn_like(learned.features_table))
    assert not torch.allclose(learned(20)[:, :8], fixed(20)[:, :8])
    # the filter is a function of the table below filter_length only
    torch.testing.assert_close(learned(20)[:, 8:], fixed(20)[:, 8:], rtol=0, atol=0)
    _, module = make("hyena", 6, filter="hyena", **{**sizes, "filter_emb_learned": True})
    module = module.double()
    with torch.no_grad():
        module.long_filter.features_table.add_(0.1 * torch.randn_like(module.long_filter.features_table))
    x = torch.randn(2, 13, 6, dtype=torch.float64)
    stepped, _ = run_steps(module, x)
    torch.testing.assert_close(stepped, module(x), rtol=1e-9, atol=1e-9)


def test_learned_positional_features_need_the_implicit_filter():
    entry = primitives()["hyena"]
    with pytest.raises(ConfigError, match="filter=hyena only") as err:
        entry.cls.create(64, {**entry.defaults, "filter_emb_learned": True})
    assert err.value.key == "filter_emb_learned"


# ---- training ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FILTERS)
def test_a_few_training_steps_reduce_the_loss(kind):
    torch.manual_seed(0)
    _, module = make("hyena", 16, filter=kind, **{**SMALL, "filter_length": 64})
    x = torch.randn(8, 32, 16)
    target = x.cumsum(1) / torch.arange(1, 33).view(1, -1, 1) ** 0.5  # a running sum: needs the long convolution
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(module(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.85 * losses[0]
    # every filter parameter is trained (gets a gradient), except fno's DC imaginary part
    for name, p in module.long_filter.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", FILTERS)
def test_bf16_autocast_keeps_the_taps_in_float32(kind):
    filt = build_filter(kind, 4, **SMALL)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        taps = filt(20)
    assert taps.dtype == torch.float32


# ---- the bundled comparison specs --------------------------------------------------------------------

HYENA_FILTER_SPECS = sorted(glob.glob("specs/hyena-filters/*.mad"))


def test_one_comparison_spec_per_family():
    assert {Path(p).stem for p in HYENA_FILTER_SPECS} == set(FILTERS)


@pytest.mark.parametrize("path", HYENA_FILTER_SPECS)
def test_comparison_specs_meet_their_budgets_and_compile_to_their_accounting(path):
    spec = madsl.load_spec(path)
    account = madsl.account(spec, seq_len=spec.budget_seq_len)
    assert not check(account.totals, spec.budget)
    assert spec.eval["tasks"] == ["associative-recall"]
    model = madsl.compile(spec, vocab_size=31)
    assert n_params(model) == madsl.account(spec, vocab=31).totals["params"]
