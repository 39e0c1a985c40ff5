"""specs/mad-lab/: the MAD paper's architectures with every layer as the MAD reference
implementation configures it (github athms/mad-lab: configs/layers/*.yml, built by the
modules of mad/model/layers/ at width 128 and, as its benchmark.py builds them, max_length =
the task setting's sequence length; 128 at the baseline).

Each layer's parameter count equals the reference module's, to the unit, at the baseline
length and at every other length of the MAD settings. The reference's counts are derived
below from its code, module by module (`nn.Linear(a, b)` is a*b + b with its default bias,
a*b without; `nn.Conv1d(c, c, k, groups=c)` is c*k + c).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch

import madsl
from madsl.topology import Layer

torch.set_num_threads(1)

BASE = "specs/mad-lab/base.mad"
MAD_LAB_SPECS = sorted(p for p in glob.glob("specs/mad-lab/*.mad") if p != BASE)
D = 128  # width
L = 128  # max_length at the baseline: the reference sizes its implicit filters' positional embedding by it
LENGTHS = (32, 64, 128, 256, 512, 1024)  # the sequence lengths of the MAD settings (configs/tasks/*.yml)


def linear(a: int, b: int, bias: bool = True) -> int:
    return a * b + (b if bias else 0)


def depthwise_conv(channels: int, taps: int) -> int:
    return channels * taps + channels


def implicit_filter(channels: int, order: int, emb_dim: int = 3, length: int = L) -> int:
    """featurization/hyena_filter.py HyenaFilter (nested: false, depth_implicit 2): Linear(emb, order),
    2 x Linear(order, order), Linear(order, channels, bias=False), Sin's freq (order), and
    PositionalEmbedding's z (max_length x emb_dim, a parameter: lr_pos_emb is not 0). The
    ExponentialModulation's deltas are a buffer (modulation_lr 0)."""
    return (
        linear(emb_dim, order)
        + 2 * linear(order, order)
        + linear(order, channels, bias=False)
        + order
        + length * emb_dim
    )


def hyena(length: int = L) -> int:
    """hyena.yml -> HyenaOperator: inner_dim = 4 * 128 = 512, in_proj dim -> 3 * 512 / proj_groups 4,
    short_filter over 3 * 512 channels, HyenaConv over 512 channels (a bias of 512 and the filter of
    order 4), out_proj 512 -> 128."""
    return (
        linear(D, 3 * 4 * D // 4)
        + depthwise_conv(3 * 4 * D, 3)
        + 4 * D
        + implicit_filter(4 * D, 4, length=length)
        + linear(4 * D, D)
    )


def mh_hyena(length: int = L) -> int:
    """mh-hyena.yml -> MultiHeadHyenaOperator: inner_factor 1, proj_groups 4 (HyenaOperator's default),
    head_dim = 128 / 16 = 8, MultiHeadHyenaConv over head_dim * (order - 1) = 8 channels."""
    return linear(D, 3 * D // 4) + depthwise_conv(3 * D, 3) + 8 + implicit_filter(8, 2, length=length) + linear(D, D)


def hyena_experts(length: int = L) -> int:
    """hyena-experts.yml -> HyenaExpertsOperator: in_proj dim -> 3 * 16 * 8, short_filter over 384
    channels, out_proj 16 -> 128, router Linear(128, 8), HyenaConv over 128 channels (bias + filter
    of order 16)."""
    return (
        linear(D, 3 * 16 * 8)
        + depthwise_conv(3 * 16 * 8, 3)
        + linear(16, D)
        + linear(D, 8)
        + D
        + implicit_filter(D, 16, length=length)
    )


HYENA, MH_HYENA, HYENA_EXPERTS = hyena(), mh_hyena(), hyena_experts()
# attention.yml, mh-attention.yml -> flash-attn's MHA: Wqkv and out_proj with biases; rotary has none.
ATTENTION = linear(D, 3 * D) + linear(D, D)
# gated-linear-attention.yml: q, k, v, g (no bias), gk_proj (Linear(128, 16, no bias), Linear(16, 128)),
# o_proj, and the RMSNorm over the head's values (one weight per head channel).
GLA = 4 * linear(D, D, bias=False) + linear(D, 16, bias=False) + linear(16, D) + linear(D, D, bias=False) + D
MH_GLA = GLA - D + D // 8  # 8 heads: the RMSNorm is over a head's 16 values
# mamba.yml: d_inner 256, dt_rank ceil(128 / 16) = 8, d_state 4, d_conv 4, no bias but the conv's.
MAMBA = (
    linear(D, 2 * 2 * D, bias=False)
    + depthwise_conv(2 * D, 4)
    + linear(2 * D, 8 + 2 * 4, bias=False)
    + linear(8, 2 * D)
    + 2 * D * 4
    + 2 * D
    + linear(2 * D, D, bias=False)
)
# swiglu.yml: dim_inner null -> GLU's rule int(2 * 128 * 4 / 3) = 341, up to a multiple of 16: 352.
SWIGLU = 3 * linear(D, 352, bias=False)
# moe-mlp.yml -> MoeMlp: up1, up2 128 -> 16 * 8, down1 16 * 8 -> 128 * 8 (all bias false), router
# Linear(128, 8) with its bias, and `gates` (8 x 16), a parameter its forward never reads.
MOE_GATES = 8 * 16
MOE = 2 * linear(D, 16 * 8, bias=False) + linear(16 * 8, D * 8, bias=False) + linear(D, 8) + MOE_GATES

REFERENCE = {
    "H": HYENA,
    "mH": MH_HYENA,
    "He": HYENA_EXPERTS,
    "A": ATTENTION,
    "mA": ATTENTION,
    "Alg": GLA,
    "mAlg": MH_GLA,
    "Mb": MAMBA,
    "Sg": SWIGLU,
    "MoE": MOE,
}
# what madsl leaves out of its count: parameters the reference holds but never uses
UNUSED = {"MoE": MOE_GATES}


def reference_at(length: int) -> dict[str, int]:
    """The reference's count of every layer built with max_length = `length` (only the Hyena
    family's implicit filters depend on it)."""
    return {**REFERENCE, "H": hyena(length), "mH": mh_hyena(length), "He": hyena_experts(length)}


def test_the_reference_counts_are_the_ones_the_issue_states():
    """The derivations above reproduce the counts measured from the reference's modules."""
    assert (HYENA, MH_HYENA, HYENA_EXPERTS, SWIGLU, MOE) == (124_348, 30_862, 57_464, 135_168, 165_000)


@pytest.mark.parametrize("length", LENGTHS)
def test_every_layer_has_the_reference_parameter_count_to_the_unit(length):
    """At every sequence length of the MAD settings: the accounting at that length, and the
    modules madsl.compile builds for it, hold the reference's count of each layer built with
    max_length = that length."""
    spec = madsl.load_spec(BASE)
    account = madsl.account(spec, seq_len=length)
    counted = {row.symbol: row.params - row.norm_params for row in account.layers}
    assert set(counted) == set(REFERENCE), "base.mad holds every reference layer once"
    assert counted == {symbol: count - UNUSED.get(symbol, 0) for symbol, count in reference_at(length).items()}
    # and the modules madsl builds from them hold exactly those parameters
    model = madsl.compile(spec, vocab_size=16, max_seq_len=length)
    built = {symbol: sum(p.numel() for p in layers[0].parameters()) for symbol, layers in model.named_layers.items()}
    assert built == counted


@pytest.mark.parametrize("path", MAD_LAB_SPECS, ids=lambda p: Path(p).stem)
def test_each_architecture_is_its_paper_twin_with_the_reference_layers(path):
    spec = madsl.load_spec(path)
    paper = madsl.load_spec(Path("specs/paper") / Path(path).name)
    base = madsl.load_spec(BASE)
    assert spec.canonical() == paper.canonical()
    for symbol in spec.symbols_used():
        assert spec.symbols[symbol].params == base.symbols[symbol].params, symbol


def test_every_paper_architecture_has_a_mad_lab_twin():
    assert {Path(p).name for p in MAD_LAB_SPECS} == {Path(p).name for p in glob.glob("specs/paper/*.mad")}


# ---- the reference's computations, from madsl's weights ---------------------------------------------


def _module(symbol: str, length: int = L) -> torch.nn.Module:
    """base.mad's layer `symbol` built for sequences of `length`, in float64, its weights moved off
    their structured init."""
    spec = madsl.load_spec(BASE)
    torch.manual_seed(0)
    module = spec.primitive_for(Layer(symbol)).at_length(length).build().double()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return module


def test_hyena_computes_the_reference_hyena_operator():
    """HyenaOperator.forward (order 2): in_proj, its output repeated proj_groups times, the short
    filter (padding k-1, cut to L), x0, x1, v = thirds, v * x1 through fftconv with the bias as the
    skip, times x0, out_proj."""
    module = _module("H")
    u = torch.randn(2, 24, D, dtype=torch.float64)
    seq = u.shape[1]
    p = u @ module.in_proj.weight.t() + module.in_proj.bias
    z = p.repeat(1, 1, 4).transpose(1, 2)
    conv = module.short_conv
    uc = torch.nn.functional.conv1d(z, conv.weight, conv.bias, padding=2, groups=z.shape[1])[..., :seq]
    x0, x1, v = uc.split(4 * D, dim=1)
    k, bias = module.long_filter(seq), module.long_filter.skip
    n = 2 * seq
    y = torch.fft.irfft(torch.fft.rfft(v * x1, n=n) * torch.fft.rfft(k, n=n) / n, n=n, norm="forward")[..., :seq]
    y = (y + (v * x1) * bias.unsqueeze(-1)) * x0
    torch.testing.assert_close(module(u), module.out_proj(y.transpose(1, 2)), rtol=1e-9, atol=1e-9)


def test_multihead_hyena_computes_the_reference_operator():
    """MultiHeadHyenaOperator.forward: in_proj repeated over 4 projection groups, the short filter,
    x1, x2, v = thirds, then fftconv_heads(v, h, bias, q=x1, v=x2, head_dim=num_heads=16): per group h
    of 16 channels the outer products v[i] x2[j] convolved with filter h (plus bias * the product),
    summed over i against x1[i]."""
    module = _module("mH")
    u = torch.randn(2, 24, D, dtype=torch.float64)
    batch, seq = u.shape[:2]
    p = u @ module.in_proj.weight.t() + module.in_proj.bias
    z = p.repeat(1, 1, 4).transpose(1, 2)
    conv = module.short_conv
    uc = torch.nn.functional.conv1d(z, conv.weight, conv.bias, padding=2, groups=z.shape[1])[..., :seq]
    x1, x2, v = (part.reshape(batch, 8, 16, seq) for part in uc.split(D, dim=1))  # (b, h, d, l)
    kv = v.unsqueeze(3) * x2.unsqueeze(2)  # (b, h, i, j, l): v[i] x2[j]
    h, bias = module.long_filter(seq)[:, None, None], module.long_filter.skip[:, None, None, None]
    n = 2 * seq
    y = torch.fft.irfft(torch.fft.rfft(kv, n=n) / n * torch.fft.rfft(h, n=n), n=n, norm="forward")[..., :seq]
    y = ((y + kv * bias) * x1.unsqueeze(3)).sum(2).reshape(batch, D, seq)  # sum over i against x1[i]
    torch.testing.assert_close(module(u), module.out_proj(y.transpose(1, 2)), rtol=1e-9, atol=1e-9)


def test_moe_computes_the_reference_moe_mlp():
    """MoeMlp.forward: x1 = up1(x), x2 = up2(x), z = down1(x1 * gelu_tanh(x2)) reshaped (dim, experts),
    router logits below the 2nd largest set to 0, softmax over all 8, weighted sum over experts."""
    module = _module("MoE")
    x = torch.randn(3, 5, D, dtype=torch.float64)
    up1 = module.w_up.permute(1, 0, 2).reshape(D, 8 * 16)  # expert e's units at e*16 .. e*16+15
    up2 = module.w_gate.permute(1, 0, 2).reshape(D, 8 * 16)
    down1 = module.w_down.permute(1, 2, 0).reshape(8 * 16, D * 8)  # output d*8 + e: expert e's channel d
    hidden = (x @ up1) * torch.nn.functional.gelu(x @ up2, approximate="tanh")
    z = (hidden @ down1).reshape(3, 5, D, 8)
    scores = x @ module.router.weight.t() + module.router.bias
    kth = scores.topk(2, dim=-1).values.min(dim=-1, keepdim=True).values
    scores = torch.where(scores < kth, torch.zeros_like(scores), scores).softmax(dim=-1)
    for dense_dispatch in (True, False):  # the gather path cannot weigh every expert: never taken here
        module.dense_dispatch = dense_dispatch
        torch.testing.assert_close(module(x), (z * scores.unsqueeze(-2)).sum(-1), rtol=1e-9, atol=1e-9)


def test_leaky_routing_keeps_weight_on_unselected_experts():
    from madsl.layers.routing import route

    logits = torch.tensor([[3.0, 1.0, 2.0, -1.0]])
    leaky = torch.tensor([[3.0, 0.0, 2.0, 0.0]]).softmax(-1)  # below the 2nd largest: 0, not -inf
    torch.testing.assert_close(route(logits, 2, leaky=True), leaky)
    sparse = route(logits, 2, leaky=False)
    assert sparse[0, 1] == sparse[0, 3] == 0 and torch.isclose(sparse.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("dim, multiple_of", [(128, 16), (1536, 16), (40, 32), (100, 7)])
def test_swiglu_inner_null_is_the_reference_glu_rule(dim, multiple_of):
    from madsl.lang.stdlib import primitives

    entry = primitives()["swiglu"]
    prim = entry.cls.create(dim, {**entry.defaults, "inner": None, "multiple_of": multiple_of})
    inner = int(2 * dim * 4 / 3)  # mad/model/layers/mlp.py GLU, as written there
    assert prim.width == multiple_of * ((inner + multiple_of - 1) // multiple_of)
