"""specs/mad-lab/'s Hyena family at every length, and Hyena experts' channel layout (torch only).

The MAD reference (github athms/mad-lab) builds each layer for its task setting: benchmark.py's
make_model_fn sets every layer's `max_length` to the setting's sequence length, and the Hyena
family sizes its implicit filter by it (featurization/hyena_filter.py: PositionalEmbedding's
features over max_length positions, a parameter, and its time t = linspace(0, 1, max_length);
ExponentialModulation's window exp(-t |delta_c|) over that time). madsl states this as
`filter_length: seq_len`, resolved where a plan is built: at the accounting's seq_len and at
madsl.compile's max_seq_len. Its HyenaExpertsOperator reshapes its output to (..., dim_inner,
num_experts), so expert e's channels are j * num_experts + e: `expert_layout: interleaved`.

The reference's computations are written out below from its code, on madsl's weights (the
parity benchmark, benchmarks/mad_lab_parity.py, runs the reference's own modules, which need
einops and a checkout of the reference).
"""

from __future__ import annotations

import math

import pytest
import torch

import madsl
from madsl.errors import MadslError
from madsl.primitives.base import ConfigError
from madsl.topology import Layer

torch.set_num_threads(1)

BASE = "specs/mad-lab/base.mad"
D = 128
HYENA_FAMILY = ("H", "mH", "He")


def _perturbed(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return module


def _layer(symbol: str, length: int, **overrides) -> torch.nn.Module:
    """base.mad's `symbol` (with `overrides`) built for sequences of `length`, float64, perturbed."""
    spec = madsl.load_spec(BASE)
    torch.manual_seed(0)
    layer = Layer(symbol, tuple(overrides.items()))
    return _perturbed(spec.primitive_for(layer).at_length(length).build().double())


# ---- the length rule ---------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [32, 127, 128, 1024])
def test_the_filters_follow_the_length_the_model_is_built_for(length):
    """compile(max_seq_len=L) builds every Hyena-family filter with filter_length L (its learned
    features L x 3), and the accounting at seq_len L states that length and that count."""
    spec = madsl.load_spec(BASE)
    account = madsl.account(spec, seq_len=length)
    model = madsl.compile(spec, vocab_size=16, max_seq_len=length)
    rows = {row.symbol: row for row in account.layers}
    for symbol in HYENA_FAMILY:
        assert rows[symbol].config["filter_length"] == length
        filt = model.named_layers[symbol][0].long_filter
        assert filt.reference_length == length
        assert tuple(filt.features_table.shape) == (length, 3)
        built = sum(p.numel() for p in model.named_layers[symbol][0].parameters())
        assert built == rows[symbol].params - rows[symbol].norm_params
    # H grows by 3 per position from its 124,348 at the baseline (tests/test_mad_lab_specs.py)
    assert rows["H"].params - rows["H"].norm_params == 124_348 + 3 * (length - 128)


def test_seq_len_is_a_word_the_spec_keeps_and_the_identity_holds():
    spec = madsl.load_spec("specs/mad-lab/hyena-experts-sg.mad")
    params = spec.identity()["layers"]["He"]["params"]
    assert params["filter_length"] == "seq_len" and params["expert_layout"] == "interleaved"
    # the same spec at another accounting length is one model: its identity does not hold a length
    assert madsl.account(spec, seq_len=512).layers[0].config["filter_length"] == 512


def test_the_paper_specs_keep_their_identities():
    """specs/paper/ states neither: filter_length stays the stdlib's 1024 (their modal filter does
    not read it) and expert_layout, at its default, is left out of the identity."""
    for name in ("hyena-experts-sg", "striped-hyena-experts-moe", "hyena-sg", "mh-hyena-sg"):
        identity = madsl.load_spec(f"specs/paper/{name}.mad").identity()
        for layer in identity["layers"].values():
            assert "expert_layout" not in layer["params"]
            if "filter_length" in layer["params"]:
                assert layer["params"]["filter_length"] == 1024


def test_an_unresolved_layer_is_neither_built_nor_accounted():
    prim = madsl.load_spec(BASE).primitive_for(Layer("H"))
    assert prim.length_relative() == ("filter_length",)
    with pytest.raises(ConfigError, match="seq_len"):
        prim.build()
    with pytest.raises(ConfigError, match="seq_len"):
        prim.cost(128)
    assert prim.at_length(256).filter_length == 256 and prim.at_length(256).length_relative() == ()


def test_filter_length_is_a_number_or_seq_len():
    with pytest.raises(MadslError, match="must be an int or seq_len"):
        madsl.account(madsl.spec_from_topology("H{filter=hyena, filter_length=max_len}", vocab=16))


def test_a_length_that_breaks_the_filter_is_a_located_error():
    """fno's modes must fit the spectrum of resolution filter_length: checked at the length."""
    spec = madsl.spec_from_topology("H{filter=fno, filter_modes=64, filter_length=seq_len}", vocab=16)
    assert madsl.account(spec, seq_len=256).layers[0].config["filter_length"] == 256
    with pytest.raises(MadslError, match="built for sequence length 64: filter_length = seq_len"):
        madsl.account(spec, seq_len=64)


@pytest.mark.parametrize("symbol", HYENA_FAMILY)
def test_step_equals_forward_at_the_built_length(symbol):
    """The step/forward contract and the accounted state at a length other than the baseline."""
    length = 37
    module = _layer(symbol, length)
    prim = madsl.load_spec(BASE).primitive_for(Layer(symbol)).at_length(length)
    x = torch.randn(2, length, D, dtype=torch.float64)
    with torch.no_grad():
        y = module(x)
        state = module.init_state(2, dtype=torch.float64)
        outputs = []
        for t in range(length):
            y_t, state = module.step(x[:, t], state)
            outputs.append(y_t)
    torch.testing.assert_close(torch.stack(outputs, 1), y, rtol=1e-9, atol=1e-9)
    assert state["cache"][0].numel() == prim.kv_cache(length)


# ---- the reference's implicit filter at max_length M -----------------------------------------------


def reference_filter(filt, max_length: int, seq_len: int) -> torch.Tensor:
    """featurization/hyena_filter.py HyenaFilter(seq_len=max_length).forward(seq_len) on madsl's
    weights: PositionalEmbedding's z (here the learned table) and t = linspace(0, 1, M), the MLP
    with one shared Sin, ExponentialModulation exp(-t |deltas|), deltas = linspace(log(1e-2) / 1.5,
    log(1e-2) / 0.3, d); (channels, seq_len). The deltas are a buffer the reference computes in
    float32 when it is built, as madsl's decay (a float64 copy of the module holds them cast); t
    too, but madsl computes time in the filter's dtype: here both in float64."""
    dtype = filt.mlp_in.weight.dtype
    t = torch.linspace(0, 1, max_length, dtype=dtype)[:seq_len, None]
    z = filt.features_table[:seq_len]
    h = torch.sin(filt.sin.freq * filt.mlp_in(z))
    for layer in filt.mlp_hidden:
        h = torch.sin(filt.sin.freq * layer(h))
    h = filt.mlp_out(h)
    deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, filt.channels).to(dtype)
    return (h * torch.exp(-t * deltas.abs())).transpose(0, 1)


def reference_features(max_length: int, emb_dim: int = 3) -> torch.Tensor:
    """PositionalEmbedding(emb_dim, max_length).z[0]: [t, Re, Im] of exp(-i f w)."""
    t = torch.linspace(0, 1, max_length, dtype=torch.float64)[:, None]
    bands = (emb_dim - 1) // 2
    w = 2 * math.pi * torch.linspace(0, max_length - 1, max_length, dtype=torch.float64)[:, None] / max_length
    f = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float64)[None]
    return torch.cat([t, torch.cos(f * w), -torch.sin(f * w)], dim=-1)


@pytest.mark.parametrize("max_length", [32, 128, 1024])
def test_the_learned_features_start_at_the_references(max_length):
    filt = madsl.compile(madsl.load_spec(BASE), vocab_size=16, max_seq_len=max_length).named_layers["H"][0].long_filter
    torch.testing.assert_close(
        filt.features_table.detach().double(), reference_features(max_length), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("symbol", HYENA_FAMILY)
@pytest.mark.parametrize("max_length", [128, 1024])
def test_the_filter_is_the_references_at_its_max_length(symbol, max_length):
    """At inputs of max_length and of max_length - 1 (the recall tasks' inputs are one shorter
    than their setting), the taps are those of the reference's filter built for max_length."""
    filt = _layer(symbol, max_length).long_filter
    for seq_len in (max_length, max_length - 1):
        with torch.no_grad():
            torch.testing.assert_close(
                filt(seq_len), reference_filter(filt, max_length, seq_len), rtol=1e-10, atol=1e-12
            )


# ---- Hyena experts' channel layout ------------------------------------------------------------------


def reference_hyena_experts(module, u: torch.Tensor) -> torch.Tensor:
    """HyenaExpertsOperator.forward (order 2, one head, one block) on madsl's weights: in_proj,
    the short filter (padding 2, cut to L), x0, x1, v = thirds of its 384 channels, v * x1 through
    fftconv with the long conv's bias as the skip, times x0; router logits below the 2nd largest
    set to 0, softmax over the 8; the output reshaped (B, L, dim_inner 16, experts 8), weighted
    and summed over the experts, out_proj."""
    batch, seq_len, _ = u.shape
    z = module.in_proj(u).transpose(1, 2)
    conv = module.short_conv
    uc = torch.nn.functional.conv1d(z, conv.weight, conv.bias, padding=2, groups=z.shape[1])[..., :seq_len]
    x0, x1, v = uc.split(D, dim=1)
    k, bias = module.long_filter(seq_len), module.long_filter.skip
    n = 2 * seq_len
    vx = v * x1
    y = torch.fft.irfft(torch.fft.rfft(vx, n=n) * torch.fft.rfft(k, n=n) / n, n=n, norm="forward")[..., :seq_len]
    y = ((y + vx * bias.unsqueeze(-1)) * x0).transpose(1, 2)  # (B, L, 128)
    scores = module.router(u)
    kth = scores.topk(2, dim=-1).values.min(dim=-1, keepdim=True).values
    scores = torch.where(scores < kth, torch.zeros_like(scores), scores).softmax(dim=-1)
    y = (y.reshape(batch, seq_len, 16, 8) * scores.unsqueeze(-2)).sum(-1)
    return module.out_proj(y)


@pytest.mark.parametrize("length", [128, 1024])
def test_hyena_experts_computes_the_reference_operator(length):
    module = _layer("He", length)
    u = torch.randn(2, length, D, dtype=torch.float64, requires_grad=True)
    ours = module(u)
    theirs = reference_hyena_experts(module, u)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-9)
    grad = torch.randn_like(ours)
    (ours_grad,) = torch.autograd.grad(ours, u, grad)
    (theirs_grad,) = torch.autograd.grad(theirs, u, grad)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-9, atol=1e-9)


def test_the_blocked_layout_is_another_layer():
    """With the implicit filter, blocked is not the reference's layer: expert e's channels have
    the decay rates of one band of the ladder instead of the whole range."""
    interleaved, blocked = _layer("He", 128), _layer("He", 128, expert_layout="blocked")
    u = torch.randn(2, 128, D, dtype=torch.float64)
    with torch.no_grad():
        reference = reference_hyena_experts(interleaved, u)
        assert torch.allclose(interleaved(u), reference, rtol=1e-9, atol=1e-9)
        assert not torch.allclose(blocked(u), reference_hyena_experts(blocked, u), rtol=1e-3, atol=1e-3)
    decay = interleaved.long_filter.decay  # slowest at channel 0, fastest at the last
    by_expert_interleaved = decay.reshape(16, 8).T  # expert e: channels j * 8 + e
    by_expert_blocked = decay.reshape(8, 16)  # expert e: channels e * 16 + j
    assert (by_expert_interleaved.min(1).values < decay[8] + 1e-6).all()  # each expert has a slow channel
    assert (by_expert_interleaved.max(1).values > decay[-9] - 1e-6).all()  # and a fast one
    assert by_expert_blocked[0].max() < by_expert_blocked[-1].min()  # blocked: disjoint bands
